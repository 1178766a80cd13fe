"""The layers stay visible: every import between mps-health's modules goes down the
order written in docs/DEVELOPING.md ("Layers"), no module imports itself back, no two
folders import each other, however indirectly, and no module imports one of the
package's modules by a name written as a string (``".probes.dirs:gather"``), which this
reader could not see.

Read from the source with ``ast`` (imports inside functions and under TYPE_CHECKING
count too: a lazy import is still a dependency), without importing anything.
"""

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest
from conftest import REPO

# Each folder of the package is one layer: a module's layer is its folder's (checks/ has
# its shared helpers as the one exception: the check helpers below the checks).
FOLDER_LAYERS = {
    "model": "model", "hostio": "hostio", "config": "config",
    "probes": "probes",
    "engine": "run",
    "checks": "checks",
    "exporters": "exporters",
    "remediation": "actions", "healthcheck": "actions", "slurm": "actions",
    "cli": "commands",
}
FOLDERS = tuple(FOLDER_LAYERS)

# Lowest first. A module may import modules of its own layer and of the layers it names.
BASE = ("model", "hostio", "config")  # records; the host's files and programs; the config
LAYERS: Dict[str, Tuple[str, ...]] = {
    "model": (),
    "hostio": ("model",),
    "config": ("model", "hostio"),
    "probes": BASE,
    "run": (*BASE, "probes"),
    "check helpers": (*BASE, "probes", "run"),
    "checks": (*BASE, "probes", "run", "check helpers"),
    "exporters": (*BASE, "run"),
    "actions": (*BASE, "probes", "run", "check helpers", "checks", "exporters"),
    "commands": (*BASE, "probes", "run", "check helpers", "checks", "exporters", "actions"),
}
# Layers whose modules may not import one another (only shared helpers, a layer below).
NO_SIBLINGS = {"checks"}


def layer_of(module: str) -> str:
    """The layer a module belongs to, from its folder."""
    if module in ("mps_health.checks", "mps_health.checks.common"):
        return "check helpers"
    parts = module.split(".")
    if len(parts) < 2:
        return "model"  # the package itself: its version
    return FOLDER_LAYERS[parts[1]]


def test_every_folder_has_a_layer() -> None:
    """A new folder of the package must be given its layer here (and in the docs)."""
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert folders == set(FOLDER_LAYERS)


def modules() -> Dict[str, Path]:
    found = {"mps_health": REPO / "__init__.py"}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["mps_health", *parts])] = path
    return found


def imports_of(module: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The mps_health modules ``module`` imports (a package's name stands for its
    ``__init__``; ``from pkg import mod`` names the module)."""
    is_package = path.name == "__init__.py"
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".")
                if not is_package:
                    here = here[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != module:
                out.add(target)
    return out


GRAPH = {m: imports_of(m, p, modules()) for m, p in modules().items()}


def test_the_graph_is_read() -> None:
    """The reader sees the imports it must judge (a broken reader would pass anything)."""
    assert "mps_health.checks.common" in GRAPH["mps_health.checks.daemon"]
    assert "mps_health.probes.control" in GRAPH["mps_health.probes.server_queries"]
    assert "mps_health.cli.common" in GRAPH["mps_health.cli.main"]
    assert len(GRAPH) > 80


def upward(graph: Dict[str, Set[str]]) -> List[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            allowed = theirs in LAYERS[mine] or (theirs == mine and mine not in NO_SIBLINGS)
            if not allowed:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    return wrong


def test_no_import_goes_up_the_layers() -> None:
    assert upward(GRAPH) == []


def cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle, as the modules along it, or None."""
    state: Dict[str, int] = {}  # 1 on the current path, 2 done
    path: List[str] = []

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return [*path[path.index(t):], t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle() -> None:
    assert cycle(GRAPH) is None


def folder_of(module: str) -> str:
    """The folder a module lives in (the package's own ``__init__`` is its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_edges(graph: Dict[str, Set[str]]) -> Dict[Tuple[str, str], List[str]]:
    """Each import from one folder into another, as the module imports making it."""
    edges: Dict[Tuple[str, str], List[str]] = {}
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            pair = (folder_of(module), folder_of(target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, []).append(f"{module} imports {target}")
    return edges


def folder_circles(graph: Dict[str, Set[str]]) -> List[str]:
    """The imports between folders that lie on a circle of folders (each folder of a
    circle reaches the other): what must move for the folders to be layers."""
    edges = folder_edges(graph)
    out: Dict[str, Set[str]] = {}
    for a, b in edges:
        out.setdefault(a, set()).add(b)

    def reach(start: str) -> Set[str]:
        seen: Set[str] = set()
        todo = [start]
        while todo:
            for nxt in out.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {folder: reach(folder) for folder in out}
    return [f"{a} -> {b}: {made}" for (a, b), imports in sorted(edges.items())
            if a in reached.get(b, ()) for made in imports]


def test_no_import_circle_between_folders() -> None:
    """A folder is a layer only if no folder it imports imports it back, directly or
    through others: the folders' order (docs/DEVELOPING.md, "Layers") is one-way."""
    assert folder_circles(GRAPH) == []


def test_a_circle_between_folders_is_caught() -> None:
    graph = {"mps_health.config.inputs": {"mps_health.hostio.safefiles"},
             "mps_health.hostio.safefiles": set(),
             "mps_health.hostio.state": {"mps_health.model.codec"},
             "mps_health.model.codec": set(),
             "mps_health.model.results": {"mps_health.config.load"},
             "mps_health.config.load": set(),
             "mps_health.cli.main": {"mps_health.model.results"}}
    assert folder_circles(graph) == [
        "config -> hostio: mps_health.config.inputs imports mps_health.hostio.safefiles",
        "hostio -> model: mps_health.hostio.state imports mps_health.model.codec",
        "model -> config: mps_health.model.results imports mps_health.config.load"]
    graph["mps_health.model.results"] = set()
    assert folder_circles(graph) == []


# A module named in a string, as a table of "module:function" targets or an argument of
# importlib.import_module would name it: an import the graph above cannot see.
ADDRESS = re.compile(r"(mps_health)?(\.\w+)+(:\w+)?")
# Names that import nothing the graph misses: module -> the string, and why.
NAMED_ON_PURPOSE = {
    ("mps_health.engine.registry", ".checks"): "the checks are found by listing their package",
    ("mps_health.engine.run", "mps_health.hostio.runner"):
        "an overrun looks the module up, never imports it (a stuck thread may hold its lock)",
    ("mps_health.slurm.render", "mps_health.slurm"): "where Jinja2 finds the templates",
}


def addressed(module: str, path: Path, known: Dict[str, Path]) -> List[str]:
    """The strings in ``module`` that name one of the package's modules."""
    found = []
    nodes = sorted(ast.walk(ast.parse(path.read_text(), str(path))),
                   key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and ADDRESS.fullmatch(node.value):
            name = node.value.partition(":")[0]
            if ("mps_health" + name if name.startswith(".") else name) in known \
                    and (module, node.value) not in NAMED_ON_PURPOSE:
                found.append(f"{module}:{node.lineno} names {node.value!r}")
    return found


def test_no_module_is_imported_by_a_name_in_a_string() -> None:
    known = modules()
    assert [line for m, p in known.items() for line in addressed(m, p, known)] == []


def test_a_name_in_a_string_is_caught(tmp_path: Path) -> None:
    src = tmp_path / "main.py"
    src.write_text('COMMANDS = {"check": (".cli.check", "run the checks")}\n'
                   'import importlib\nimportlib.import_module("mps_health.probes.slurm")\n'
                   'SOURCE = ".probes.dirs:gather"\nBUILTIN = ".checks"\n'
                   'ok = (f"{__name__}:check", "see .probes.dirs:gather", "mps_health", ".x")\n')
    known = {m: tmp_path for m in ("mps_health.cli.check", "mps_health.probes.slurm",
                                   "mps_health.probes.dirs", "mps_health.checks")}
    assert addressed("mps_health.cli.main", src, known) == [
        "mps_health.cli.main:1 names '.cli.check'",
        "mps_health.cli.main:3 names 'mps_health.probes.slurm'",
        "mps_health.cli.main:4 names '.probes.dirs:gather'",
        "mps_health.cli.main:5 names '.checks'"]
    assert addressed("mps_health.engine.registry", src, known)[-1].endswith("'.probes.dirs:gather'")


@pytest.mark.parametrize("graph, says", [
    ({"mps_health.probes.canary": {"mps_health.checks.daemon"}, "mps_health.checks.daemon": set()},
     "mps_health.probes.canary (probes) imports mps_health.checks.daemon (checks)"),
    ({"mps_health.hostio.state": {"mps_health.config.load"}, "mps_health.config.load": set()},
     "mps_health.hostio.state (hostio) imports mps_health.config.load (config)"),
    ({"mps_health.engine.run": {"mps_health.checks.daemon"}, "mps_health.checks.daemon": set()},
     "mps_health.engine.run (run) imports mps_health.checks.daemon (checks)"),
    ({"mps_health.remediation.unit": {"mps_health.cli.common"},
      "mps_health.cli.common": set()},
     "mps_health.remediation.unit (actions) imports mps_health.cli.common (commands)"),
    ({"mps_health.checks.orphans": {"mps_health.checks.gres_drift"},
      "mps_health.checks.gres_drift": set()},
     "mps_health.checks.orphans (checks) imports mps_health.checks.gres_drift (checks)"),
    ({"mps_health.config.load": {"mps_health.exporters.prometheus"},
      "mps_health.exporters.prometheus": set()},
     "mps_health.config.load (config) imports mps_health.exporters.prometheus (exporters)"),
])
def test_an_upward_import_is_caught(graph: Dict[str, Set[str]], says: str) -> None:
    assert upward(graph) == [says]


def test_a_cycle_is_caught() -> None:
    graph = {"mps_health.cli.main": {"mps_health.cli.parser"},
             "mps_health.cli.parser": {"mps_health.cli.main"}}
    assert cycle(graph) == ["mps_health.cli.main", "mps_health.cli.parser", "mps_health.cli.main"]
    assert cycle({"mps_health.cli.main": {"mps_health.cli.parser"},
                  "mps_health.cli.parser": set()}) is None


def test_relative_and_lazy_imports_are_read(tmp_path: Path) -> None:
    src = tmp_path / "canary.py"
    src.write_text("from ..model.facts import Facts\n\ndef f():\n    from . import control\n"
                   "    from mps_health.checks.daemon import expected_uid\n")
    known = {m: tmp_path for m in ("mps_health.model.facts", "mps_health.probes.control",
                                   "mps_health.checks.daemon", "mps_health.probes.canary")}
    assert imports_of("mps_health.probes.canary", src, known) == {
        "mps_health.model.facts", "mps_health.probes.control", "mps_health.checks.daemon"}
