"""A check is one module that declares itself: no list of checks to edit.

Every module of ``checks/`` (bar its helpers) is in ``registry.checks()`` with its own
target, ``engine/registry.py`` names no check, and a module dropped into a copy of the
package runs, at the place its ``order`` gives, with nothing else edited.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from mps_health.engine import registry
from paths import REPO

# The run's and every output's order (users and tests read it).
BUILT_IN_ORDER = ["daemon", "strays", "control", "blockers", "directories", "tmpfiles", "servers",
                  "limits", "logs", "canary", "compute-mode", "gres-drift", "orphans",
                  "clients"]


def test_every_module_of_checks_declares_its_own_check() -> None:
    import importlib

    table = registry.checks()
    stems = sorted(p.stem for p in (REPO / "checks").glob("*.py"))
    for stem in stems:
        if stem == "__init__" or stem in registry.HELPERS:
            continue
        module = importlib.import_module(f"mps_health.checks.{stem}")
        spec = table.get(module.NAME)
        assert spec is not None, f"checks/{stem}.py declares no check"
        assert spec.target == f".checks.{stem}:check"


def test_the_registry_names_no_check() -> None:
    """Its module-level calls declare fact sources only; no string names a check module."""
    tree = ast.parse((REPO / "engine" / "registry.py").read_text())
    calls = [node.value.func.id for node in tree.body
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name)]
    assert calls and set(calls) == {"source"}
    named = [n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and n.value.startswith(".checks.")]
    assert named == []


def test_the_built_ins_keep_their_order() -> None:
    assert [n for n in registry.checks() if n in BUILT_IN_ORDER] == BUILT_IN_ORDER


def test_a_site_check_without_an_order_runs_after_the_built_ins() -> None:
    registry.checks()
    registry.check("made-site", "made_site:check", ("dirs",))
    try:
        assert list(registry.checks())[-1] == "made-site"
        assert list(registry.checks())[:len(BUILT_IN_ORDER)] == BUILT_IN_ORDER
    finally:
        del registry._CHECKS["made-site"]


MADE_CHECK = '''
from mps_health.engine import registry
from mps_health.model.results import ok

NAME = "made-new"
CODES = ()
registry.check(NAME, f"{__name__}:check", ("dirs",), order=35, summary="made")


def check(facts, config):
    yield ok(NAME, "", "made check ran")
'''

LIST_AND_RUN = '''
import json, sys
from mps_health.cli.main import main
from mps_health.engine import registry
print(json.dumps([registry.__file__, list(registry.checks())]))
sys.stdout.flush()
sys.exit(main(["check", "--only", sys.argv[1], "--root", sys.argv[2], "--config", sys.argv[3],
              "--format", "json"]))
'''


@pytest.fixture
def package_copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of the package's code (no tests or docs), importable as mps_health."""
    copy = tmp_path / "lib" / "mps_health"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(
        ".git", "tests", "bench", "contrib", "docs", "examples", "build", "__pycache__",
        "*.egg-info"))
    yield copy


def _list_and_run(copy: Path, tmp_path: Path, only: str) -> tuple:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    config = tmp_path / "empty.yaml"  # the defaults, never the host's /etc/mps-health
    config.write_text("")
    env = {"PATH": "/nonexistent", "PYTHONPATH": str(copy.parent)}
    r = subprocess.run([sys.executable, "-c", LIST_AND_RUN, only, str(root), str(config)],
                       capture_output=True, text=True, timeout=120, env=env)
    first, _, rest = r.stdout.partition("\n")
    where, names = json.loads(first)
    assert Path(where).is_relative_to(copy), where  # the copy, not this checkout
    return names, json.loads(rest), r


def test_a_module_dropped_into_checks_runs_in_its_place(package_copy: Path,
                                                        tmp_path: Path) -> None:
    (package_copy / "checks" / "made_new.py").write_text(MADE_CHECK)
    names, report, r = _list_and_run(package_copy, tmp_path, "made-new")
    assert names == [*BUILT_IN_ORDER[:4], "made-new", *BUILT_IN_ORDER[4:]]
    (run,) = report["checks"]
    assert (run["name"], run["results"][0]["message"]) == ("made-new", "made check ran")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_check_module_that_cannot_be_imported_is_reported(package_copy: Path,
                                                           tmp_path: Path) -> None:
    """A broken install is never a check that silently stops running: it stands in under
    its file's name and its run is UNKNOWN check-failed, saying why."""
    (package_copy / "checks" / "made_broken.py").write_text(
        'raise ImportError("made_broken needs a module this node lacks")\n')
    names, report, r = _list_and_run(package_copy, tmp_path, "made-broken")
    assert names == [*BUILT_IN_ORDER, "made-broken"]
    (run,) = report["checks"]
    (result,) = run["results"]
    assert (run["name"], result["code"], result["state"]) == ("made-broken", "check-failed", "UNKNOWN")
    assert "made_broken needs a module this node lacks" in result["message"]
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_a_default_run_loads_no_probe_of_a_check_it_does_not_run(tmp_path: Path) -> None:
    """Every run imports every check module, so the GPU and Slurm checks keep the probes
    they take fact types from out of their imports: a node without a slurm: or gpu:
    section loads neither probe."""
    code = ("import sys, io, contextlib\nfrom mps_health.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main(['check', '--root', {str(tmp_path)!r}])\n"
            "from mps_health.engine import registry\n"
            "print(len(registry.checks()), sorted(m for m in sys.modules if m.startswith("
            "('mps_health.probes.slurm', 'mps_health.probes.nvml', 'mps_health.probes.jobs',"
            " 'mps_health.probes.gres_conf', 'mps_health.probes.jobdirs'))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/nonexistent"})
    assert r.stdout.split("\n")[-2] == f"{len(BUILT_IN_ORDER)} []", r.stdout + r.stderr
