"""mps_health.config.inputs and the quoting of config values: bounded whatever the input.

The command-level cases (memory caps, crashes only a subprocess survives) are in
tests/e2e/test_hostile_inputs.py; these are the rules themselves, on small data.
"""

import os
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from mps_health.config import inputs
from mps_health.config.schema import SHOWN_MAX, shown
from mps_health.exporters import text
from mps_health.hostio.safefiles import read_small
from mps_health.model.results import WARNING, CheckRun, Report, Result


def test_tree_size_counts_aliases_each_time_they_are_used() -> None:
    data = yaml.safe_load("a: &x [1, 2, 3]\nb: [*x, *x]\n")
    assert data["b"][0] is data["b"][1] is data["a"]  # shared, not copied: small in memory
    # the mapping, 2 keys, a's list and 3 items, b's list, twice (list and 3 items)
    assert inputs.tree_size(data) == 1 + 2 + 4 + 1 + 2 * 4


def test_tree_size_stops_at_the_limit_and_on_a_cycle() -> None:
    wide = [[0] * 10] * 10
    assert inputs.tree_size(wide, limit=111) == 111
    with pytest.raises(inputs.InputError, match="more than 110 values"):
        inputs.tree_size(wide, limit=110)
    cycle: list = [0]
    cycle.append(cycle)
    with pytest.raises(inputs.InputError):
        inputs.tree_size(cycle)


def test_tree_size_bounds_depth() -> None:
    deep: list = []
    for _ in range(inputs.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(inputs.InputError, match="nested more than 64 levels"):
        inputs.tree_size(deep)
    assert inputs.tree_size(deep[0]) == inputs.MAX_DEPTH + 1


def test_yaml_nesting_refuses_deep_documents_before_composing() -> None:
    deep = "x: " + "[" * 3000 + "]" * 3000
    with pytest.raises(inputs.InputError, match="line 1: nested more than 64 levels"):
        inputs.parse_yaml(deep)
    inputs.parse_yaml("x: " + "[" * 63 + "]" * 63 + " " * 3000)  # 64 with the map
    with pytest.raises(inputs.InputError, match="not valid YAML"):  # broken, not too deep
        inputs.parse_yaml("x: [1, 2" + " " * 3000)


def test_libyaml_refusing_depth_itself_is_worded_as_ours(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # libyaml 0.2.6 (PyYAML 6.0.4's wheels) stops past 1000 levels in its scanner, which
    # reads ahead of the events the depth is counted on: the same line either way.
    mark = yaml.Mark("<unicode string>", 1002, 2, 1002, None, None)
    refused = yaml.scanner.ScannerError("while increasing flow level", mark,
                                        "exceeded maximum nesting depth", mark)
    other = yaml.scanner.ScannerError("while scanning", mark, "found a tab", mark)
    def raising(error: Exception) -> Callable[..., Any]:
        def load(*args: Any, **kwargs: Any) -> Any:
            raise error
        return load

    with monkeypatch.context() as patched:  # the error the load of a short text raises
        patched.setattr(yaml, "load", raising(refused))
        with pytest.raises(inputs.InputError, match=r"^line 3: nested more than 64 levels deep$"):
            inputs.parse_yaml("x: 1")
        patched.setattr(yaml, "load", raising(other))
        with pytest.raises(inputs.InputError, match=r"^line 3: not valid YAML: found a tab$"):
            inputs.parse_yaml("x: 1")  # not a depth: worded as the load's own error
    # A flow sequence opened at once is what libyaml's look-ahead refuses before the
    # 65th level's event: whichever libyaml this is, the line is ours.
    for body in ("x: " + "[" * 3000 + "]" * 3000, "x:\n  - " + "[" * 1500 + "]" * 1500):
        with pytest.raises(inputs.InputError, match="nested more than 64 levels deep"):
            inputs.parse_yaml(body)


def test_read_text_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(inputs.InputError, match=r"byte 0xff on line 2"):
        inputs.read_text(str(path), 100)
    with pytest.raises(inputs.InputError, match="larger than 4 bytes"):
        inputs.read_text(str(path), 4)
    assert inputs.read_text(str(tmp_path / "missing"), 100) is None
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(inputs.InputError, match="not a regular file"):
        inputs.read_text(str(tmp_path / "fifo"), 100)


def test_a_link_is_followed_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("x: 1\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(inputs.InputError, match="symbolic link"):
        inputs.read_text(str(tmp_path / "link"), 100)
    assert inputs.read_text(str(tmp_path / "link"), 100, follow=True) == "x: 1\n"
    with pytest.raises(OSError):
        read_small(str(tmp_path / "link"))
    assert read_small(str(tmp_path / "link"), follow=True) == b"x: 1\n"


def test_shown_is_short_for_values_that_repeat_themselves() -> None:
    bomb: list = ["lol"] * 9
    for _ in range(12):  # 9**13 strings by reference: a full repr would never finish
        bomb = [bomb] * 9
    assert len(shown(bomb)) <= SHOWN_MAX
    cycle: dict = {}
    cycle["a"] = cycle
    assert len(shown(cycle)) <= SHOWN_MAX
    assert shown("x" * 1000) == "'" + "x" * (SHOWN_MAX - 4) + "..."


def test_the_summary_line_keeps_labels_in_order_once_with_their_counts() -> None:
    results = tuple(Result("daemon", WARNING, code, inst, "m")
                    for code, inst in [("a", "j1"), ("b", ""), ("a", "j1"), ("a", "j2")])
    report = Report("n", 0.0, 0.0, (CheckRun("daemon", results, 0.0),), {}, "v")
    # Once each, a repeated one with its count: the counts add up to the N it says.
    assert text.summary_line(report) == "MPS WARNING - 4 problems: a j1 x2, b, a j2"
