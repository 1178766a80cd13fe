"""Every check has its unit test file here, and that file tests every code the check emits.

A check is ``checks/NAME.py``, which declares itself (``registry.check``); its tests are
``tests/unit/checks/test_NAME.py``, on made facts. A code counts as tested only where it
is a string literal inside an ``assert`` or a ``pytest.mark.parametrize`` (read with
``ast``): a code named in a comment, a docstring or a helper proves nothing, and a code
added to a check's ``CODES`` without a test fails here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import pytest
from mps_health.engine import registry
from paths import REPO

HERE = Path(__file__).resolve().parent


def check_modules() -> Dict[str, Tuple[str, ...]]:
    """Each registered check's module (its file name in checks/) -> its CODES. A site's
    own check (``checks.modules``, registered by a test that loads such a config) is not
    the package's to test here."""
    out: Dict[str, Tuple[str, ...]] = {}
    for spec in registry.checks().values():
        module = spec.target.partition(":")[0]
        if not module.startswith(".checks."):
            continue
        out[module.rsplit(".", 1)[-1]] = tuple(importlib.import_module(module, "mps_health").CODES)
    return out


def _strings(node: ast.AST) -> Iterable[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def _is_parametrize(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "parametrize"


def asserted_strings(source: str) -> Set[str]:
    """The string literals a test file puts in an ``assert`` or a parametrize's values."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            found.update(_strings(node.test))
        elif isinstance(node, ast.Call) and _is_parametrize(node):
            for arg in node.args[1:]:  # the first names the parameters
                found.update(_strings(arg))
            for kw in node.keywords:
                if kw.arg == "argvalues":
                    found.update(_strings(kw.value))
    return found


def untested(codes: Iterable[str], test_file: Path) -> List[str]:
    """The codes ``test_file`` never asserts (all of them when there is no such file)."""
    asserted = asserted_strings(test_file.read_text()) if test_file.is_file() else set()
    return sorted(c for c in codes if c not in asserted)


def test_every_check_module_is_registered() -> None:
    modules = {p.stem for p in (REPO / "checks").glob("*.py")} - {"__init__", "common"}
    assert modules == set(check_modules())


@pytest.mark.parametrize("module", sorted(check_modules()))
def test_each_check_has_a_test_file_asserting_every_code(module: str) -> None:
    path = HERE / f"test_{module}.py"
    assert path.is_file(), f"checks/{module}.py has no unit test file {path}"
    missing = untested(check_modules()[module], path)
    assert missing == [], (f"codes of checks/{module}.py never asserted in {path.name} "
                           f"(a string literal in an assert or a parametrize): {missing}")


MADE_TESTS = '''
"""made-new is mentioned here only."""
import pytest

HELPER = "made-new"  # made-new in a comment

def test_a():
    assert run() == [(1, "made-a")]

@pytest.mark.parametrize("code, state", [("made-b", 1), ("made-c", 2)])
def test_b(code, state):
    assert code

@pytest.mark.parametrize(argnames="code", argvalues=["made-d"])
def test_d(code):
    assert code
'''


def test_the_guard_fails_for_a_code_added_without_a_test(tmp_path: Path) -> None:
    """A made check module and its test file: a code only in a comment, a docstring or
    a helper is untested; one in an assert or a parametrize's values is tested."""
    (tmp_path / "made_check.py").write_text(
        'CODES = ("made-a", "made-b", "made-c", "made-d", "made-new")\n')
    spec = importlib.util.spec_from_file_location("made_check", tmp_path / "made_check.py")
    assert spec is not None and spec.loader is not None
    made_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made_check)
    test_file = tmp_path / "test_made_check.py"
    assert untested(made_check.CODES, test_file) == list(made_check.CODES)  # no file yet
    test_file.write_text(MADE_TESTS)
    assert untested(made_check.CODES, test_file) == ["made-new"]
    test_file.write_text(MADE_TESTS + '\ndef test_new():\n    assert "made-new" in run()\n')
    assert untested(made_check.CODES, test_file) == []
    # The parametrize's first argument only names the parameters.
    test_file.write_text(MADE_TESTS)
    assert untested(["code"], test_file) == ["code"]
