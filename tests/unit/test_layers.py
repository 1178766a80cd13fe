"""The layers stay visible: every import between mps-health's modules goes down the
order written in docs/DEVELOPING.md ("Layers"), and no module imports itself back.

Read from the source with ``ast`` (imports inside functions and under TYPE_CHECKING
count too: a lazy import is still a dependency), without importing anything.
"""

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest
from conftest import REPO

# Each folder of the package is one layer: a module's layer is its folder's (checks/ has
# its shared helpers as the one exception: the check helpers below the checks).
FOLDER_LAYERS = {
    "hostio": "base", "config": "base", "model": "base",
    "probes": "probes",
    "checks": "checks",
    "engine": "run",
    "exporters": "exporters",
    "remediation": "actions", "healthcheck": "actions", "slurm": "actions",
    "cli": "commands",
}
FOLDERS = tuple(FOLDER_LAYERS)

# Lowest first. A module may import modules of its own layer and of the layers it names.
BASE = "base"
LAYERS: Dict[str, Tuple[str, ...]] = {
    BASE: (),
    "probes": (BASE,),
    "check helpers": (BASE, "probes"),
    "checks": (BASE, "probes", "check helpers"),
    "run": (BASE, "probes", "check helpers", "checks"),
    "exporters": (BASE,),
    "actions": (BASE, "probes", "check helpers", "checks", "run", "exporters"),
    "commands": (BASE, "probes", "check helpers", "checks", "run", "exporters", "actions"),
}
# Layers whose modules may not import one another (only shared helpers, a layer below).
NO_SIBLINGS = {"checks"}


def layer_of(module: str) -> str:
    """The layer a module belongs to, from its folder."""
    if module in ("mps_health.checks", "mps_health.checks.common"):
        return "check helpers"
    parts = module.split(".")
    if len(parts) < 2:
        return BASE  # the package itself: its version
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


@pytest.mark.parametrize("graph, says", [
    ({"mps_health.probes.canary": {"mps_health.checks.daemon"}, "mps_health.checks.daemon": set()},
     "mps_health.probes.canary (probes) imports mps_health.checks.daemon (checks)"),
    ({"mps_health.exporters.nagios": {"mps_health.engine.run"}, "mps_health.engine.run": set()},
     "mps_health.exporters.nagios (exporters) imports mps_health.engine.run (run)"),
    ({"mps_health.remediation.unit": {"mps_health.cli.common"},
      "mps_health.cli.common": set()},
     "mps_health.remediation.unit (actions) imports mps_health.cli.common (commands)"),
    ({"mps_health.checks.orphans": {"mps_health.checks.gres_drift"},
      "mps_health.checks.gres_drift": set()},
     "mps_health.checks.orphans (checks) imports mps_health.checks.gres_drift (checks)"),
    ({"mps_health.config.load": {"mps_health.exporters.prometheus"},
      "mps_health.exporters.prometheus": set()},
     "mps_health.config.load (base) imports mps_health.exporters.prometheus (exporters)"),
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
    src.write_text("from ..model.context import Context\n\ndef f():\n    from . import control\n"
                   "    from mps_health.checks.daemon import expected_uid\n")
    known = {m: tmp_path for m in ("mps_health.model.context", "mps_health.probes.control",
                                   "mps_health.checks.daemon", "mps_health.probes.canary")}
    assert imports_of("mps_health.probes.canary", src, known) == {
        "mps_health.model.context", "mps_health.probes.control", "mps_health.checks.daemon"}
