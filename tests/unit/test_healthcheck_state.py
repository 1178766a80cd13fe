"""The health check's memory survives damage: bad bytes, NaN, absurd numbers start afresh
or are clamped, and a run on a damaged file still counts and saves (never exit 3)."""

from pathlib import Path

from mps_health.config import from_mapping
from mps_health.remediation import hcstate, healthcheck, slurmnode
from mps_health.results import Report


def test_nan_and_inf_verified_at_mean_never_verified() -> None:
    for bad in ("nan", "inf", "-inf", "-5"):
        s = hcstate.parse(f"fails=3\ndrained=yes\nverified_at={bad}\n")
        assert s.verified_at == 0.0 and s.fails == 3 and s.drained
        # ...so a failing, drained node is re-read at once, not never.
        assert hcstate.decide(s, "fail", 2, 2, 600, None, 1e9).action == "drain"


def test_garbage_counts_and_codes_are_bounded() -> None:
    s = hcstate.parse("fails=99999999999999999\nlast_code=bad code\x1b[31m\n")
    assert s.fails == hcstate.MAX_COUNT and s.last_code == ""


def test_a_run_on_a_file_with_invalid_utf8_counts_and_saves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / hcstate.STATE_FILE
    path.write_bytes(b"fails=1\xff\npasses=0\nverified_at=nan\n")
    config = from_mapping({"state_dir": str(state), "run_dir": str(tmp_path / "run"),
                           "mps": {"pipe_dir": str(tmp_path / "pipe"),
                                   "log_dir": str(tmp_path / "log")},
                           "checks": {"only": ["directories"]},
                           "commands": {"scontrol": "/bin/false"}}, None)
    r = healthcheck.run_once(config, "/", False, {})
    assert r.rc == 2 and "failed 1/2" in r.lines[-1], r.lines
    assert hcstate.load(str(path)).fails == 1
    assert "verified_at=0" in path.read_text()


def test_every_drain_reason_has_the_colon() -> None:
    hc = healthcheck.healthcheck(from_mapping({}, None))
    for report in (None, Report("n", 0.0, 0.0, (), {}, "0")):
        _, reason = healthcheck.reason_for(report, hc, "MPS-HC:")
        code, colon, _ = reason[len("MPS-HC: "):].partition(": ")
        assert colon and " " not in code, reason
    assert slurmnode.reason_text("T:", "x:", "y") == "T: x: y"
