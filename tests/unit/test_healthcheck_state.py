"""The health check's memory survives damage: bad bytes, NaN, absurd numbers start afresh
or are clamped, and a run on a damaged file still counts and saves (never exit 3)."""

from pathlib import Path

import pytest
from hostile import public_dir  # noqa: F401
from mps_health.config.load import from_mapping
from mps_health.healthcheck import run as healthcheck
from mps_health.healthcheck import slurmnode
from mps_health.healthcheck import state as hcstate
from mps_health.model.results import Report


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


# --- a state dir that cannot be written, and a state that was lost ---------------------

def fake_scontrol(tmp_path: Path, state: str, reason: str = "") -> Path:
    """scontrol that shows node n1 as given and logs every update."""
    script = tmp_path / "scontrol"
    shown = f"NodeName=n1 State={state} Partitions=gpu" + (f" Reason={reason} [root@t]"
                                                            if reason else "")
    script.write_text("#!/bin/sh\n"
                      f"if [ \"$1\" = show ]; then echo '{shown}'; exit 0; fi\n"
                      f"echo \"$*\" >> {tmp_path}/updates\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def tmp_path(public_dir: Path) -> Path:  # noqa: F811
    """A 0755 root-owned dir (hostile.public_dir) in place of pytest's, whose base is
    0700: the directories check reports a parent of the pipe dir that other users
    cannot traverse (pipe-dir-parent)."""
    return public_dir


def hc_config(tmp_path: Path, state_dir: Path, run_dir: Path, scontrol: Path):
    for d, mode in (("pipe", 0o777), ("log", 0o755)):  # mps.dir_mode, mps.log_dir_mode
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d).chmod(mode)
    return from_mapping({"state_dir": str(state_dir), "run_dir": str(run_dir),
                         "node_name": "n1",
                         "mps": {"pipe_dir": str(tmp_path / "pipe"),
                                 "log_dir": str(tmp_path / "log")},
                         "checks": {"only": ["directories"]},
                         "commands": {"scontrol": str(scontrol)},
                         "remediation": {"audit_log": str(tmp_path / "audit.log"),
                                         "syslog": False}}, None)


def updates(tmp_path: Path) -> list:
    path = tmp_path / "updates"
    return path.read_text().splitlines() if path.exists() else []


def test_a_state_dir_that_cannot_be_written_counts_in_the_run_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # a state dir under a file: ENOTDIR, even for root
    cfg = hc_config(tmp_path, tmp_path / "file" / "state", tmp_path / "run",
                    fake_scontrol(tmp_path, "IDLE"))
    (tmp_path / "pipe").chmod(0o700)  # directories fails: pipe-dir-mode
    first = healthcheck.run_once(cfg, "/", False, {})
    assert "counting in " + str(tmp_path / "run" / hcstate.STATE_FILE) in "\n".join(first.lines)
    assert "failed 1/2" in first.lines[-1] and updates(tmp_path) == []
    second = healthcheck.run_once(cfg, "/", False, {})
    assert "drained (" in second.lines[-1], second.lines
    assert any("State=DRAIN" in u for u in updates(tmp_path))


def test_no_count_kept_anywhere_drains_at_once(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cfg = hc_config(tmp_path, tmp_path / "file" / "state", tmp_path / "file" / "run",
                    fake_scontrol(tmp_path, "IDLE"))
    (tmp_path / "pipe").chmod(0o700)
    r = healthcheck.run_once(cfg, "/", False, {})
    assert "no count can be kept: a failed run drains at once" in "\n".join(r.lines)
    assert "drained (" in r.lines[-1] and any("State=DRAIN" in u for u in updates(tmp_path))


def test_the_state_dir_back_takes_over_from_the_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / hcstate.STATE_FILE).write_text("fails=1\npasses=0\ndrained=no\n")
    cfg = hc_config(tmp_path, tmp_path / "state", run, fake_scontrol(tmp_path, "IDLE"))
    (tmp_path / "pipe").chmod(0o700)
    r = healthcheck.run_once(cfg, "/", False, {})
    assert "drained (" in r.lines[-1]  # the count went on from the run dir's
    assert not (run / hcstate.STATE_FILE).exists()
    assert hcstate.load(str(tmp_path / "state" / hcstate.STATE_FILE)).drained


def test_lost_state_on_a_node_we_drained_reads_it_once_and_resumes(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, tmp_path / "state", tmp_path / "run",
                    fake_scontrol(tmp_path, "IDLE+DRAIN",
                                  "MPS-HC: control-absent node: no daemon"))
    first = healthcheck.run_once(cfg, "/", False, {})
    assert first.rc == 0
    text = "\n".join(first.lines)
    assert "no saved state; the node is drained by us (MPS-HC: control-absent" in text, text
    assert "clean run 1 of 2 before resuming" in first.lines[-1]
    second = healthcheck.run_once(cfg, "/", False, {})
    assert "resumed (" in second.lines[-1], second.lines
    assert updates(tmp_path) == ["update NodeName=n1 State=RESUME"]
    third = healthcheck.run_once(cfg, "/", False, {})  # known now: Slurm is not asked again
    assert "no saved state" not in "\n".join(third.lines)


def test_lost_state_on_a_node_someone_else_drained_is_left(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, tmp_path / "state", tmp_path / "run",
                    fake_scontrol(tmp_path, "IDLE+DRAIN", "swapping a GPU"))
    for _ in range(3):
        r = healthcheck.run_once(cfg, "/", False, {})
    assert "node not drained by us; healthy" in r.lines[-1] and updates(tmp_path) == []
