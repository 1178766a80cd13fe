"""The strict plugin-output parser itself: it accepts what monitoring-plugins really print
and rejects each way an output can break the grammar."""

import pytest
from conftest import FIXTURES
from plugin_output import GrammarError, parse, parse_perfdata

CAPTURED = sorted(FIXTURES.glob("check_*__monitoring-plugins-2.3.3_rc*.txt"))


@pytest.mark.parametrize("path", CAPTURED, ids=[p.name for p in CAPTURED])
def test_real_monitoring_plugins_output_parses(path) -> None:
    rc = int(path.stem.rsplit("_rc", 1)[1])
    out = parse(path.read_text(), rc)
    assert out.state == {0: "OK", 1: "WARNING", 2: "CRITICAL"}[rc]


def test_captured_outputs_cover_the_grammar_variants() -> None:
    assert len(CAPTURED) >= 6
    load = parse((FIXTURES / "check_load__monitoring-plugins-2.3.3_rc0.txt").read_text(), 0)
    assert load.service == "LOAD" and load.separator == " - "
    assert load.perf("load1") == ("load1", "0.570", "", "50.000", "100.000", "0", "")
    disk = parse((FIXTURES / "check_disk__monitoring-plugins-2.3.3_rc0.txt").read_text(), 0)
    assert disk.perf("/").uom == "B"
    dummy = parse((FIXTURES / "check_dummy__monitoring-plugins-2.3.3_rc1.txt").read_text(), 1)
    assert dummy.service is None and dummy.separator == ": " and dummy.perfdata == []


@pytest.mark.parametrize("text, rc, why", [
    ("MPS OK - fine\n", 2, "does not match exit code"),
    ("MPS FINE - fine\n", 0, "first line"),
    ("MPS OK - fine | x=1e-05s\n", 0, "plain decimal"),
    ("MPS OK - fine | x=1sec\n", 0, "unit"),
    ("MPS OK - fine | x=1;abc\n", 0, "is not a range"),
    ("MPS OK - fine | x=1;;;zero\n", 0, "min"),
    ("MPS OK - fine | x=1;1;2;0;1;9\n", 0, "more than 5 fields"),
    ("MPS OK - fine | =1\n", 0, "label"),
    ("MPS OK - fine | it's=1\n", 0, "quoting"),
    ("MPS OK - fine | x=1\nlong | y=\n", 0, "plain decimal"),
    ("MPS OK - " + "x" * 8200 + "\n", 0, "8 KiB"),
    ("", 0, "no output"),
])
def test_broken_outputs_are_rejected(text: str, rc: int, why: str) -> None:
    with pytest.raises(GrammarError, match=why):
        parse(text, rc)


def test_quoted_labels_and_ranges() -> None:
    items = parse_perfdata("'a b''c'=0.5s;@1:2;~:3;0;10 u=U;10:;;;")
    assert items[0] == ("a b'c", "0.5", "s", "@1:2", "~:3", "0", "10")
    assert items[1].value == "U" and items[1].warn == "10:"
