"""The health check and a slow or frozen slurmctld: a run with nothing to change asks it
nothing; a drain or resume that times out is UNKNOWN healthcheck-slurm-failed, bounded by
slurm.timeout_s, never a drain and never a lost resume (the next run does it); the run's
duration is kept and a run over a quarter of slurmd's kill is a WARNING naming its slowest
part. Within healthcheck.boot_grace_s of boot, a unit not up yet is starting, never drained."""

import time
from pathlib import Path

import pytest
from hostile import public_dir  # noqa: F401
from mps_health.config.load import from_mapping
from mps_health.healthcheck import run as healthcheck
from mps_health.healthcheck import state as hcstate
from mps_health.model.results import (
    CRITICAL,
    OK,
    STARTING,
    CheckRun,
    Report,
    Result,
    is_problem,
    starting,
)

TAG = "MPS-HC:"


@pytest.fixture
def tmp_path(public_dir: Path) -> Path:  # noqa: F811
    """A 0755 root-owned dir (hostile.public_dir) in place of pytest's, whose base is
    0700: the directories check would report the pipe dir's parent (pipe-dir-parent)."""
    return public_dir


def recording_scontrol(tmp_path: Path, state: str, reason: str = "") -> Path:
    """scontrol that records every call in ``calls``, shows node n1 as given, records each
    update in ``updates``, and hangs (as a frozen slurmctld makes it) while ``hang`` exists."""
    script = tmp_path / "scontrol"
    shown = f"NodeName=n1 State={state} Partitions=gpu" + (f" Reason={reason} [root@t]"
                                                            if reason else "")
    script.write_text("#!/bin/sh\n"
                      f"echo \"$*\" >> {tmp_path}/calls\n"
                      f"if [ -e {tmp_path}/hang ]; then exec sleep 60; fi\n"
                      f"if [ \"$1\" = show ]; then echo '{shown}'; exit 0; fi\n"
                      f"echo \"$*\" >> {tmp_path}/updates\n")
    script.chmod(0o755)
    return script


def lines_of(tmp_path: Path, name: str) -> list:
    path = tmp_path / name
    return path.read_text().splitlines() if path.exists() else []


def hc_config(tmp_path: Path, scontrol: Path, root: str = "", **healthcheck_keys: object):
    """Only the directories check, on dirs that are right unless a test breaks them."""
    base = Path(root) if root else tmp_path
    for d, mode in (("pipe", 0o777), ("log", 0o755)):  # mps.dir_mode, mps.log_dir_mode
        (base / d).mkdir(exist_ok=True)
        (base / d).chmod(mode)
    where = "/" if root else f"{tmp_path}/"
    # A known state: a run without one reads the node once to relearn it (by design).
    (base / "state").mkdir(exist_ok=True)
    (base / "state" / hcstate.STATE_FILE).write_text("fails=0\npasses=0\ndrained=no\n")
    return from_mapping({"state_dir": f"{where}state", "run_dir": f"{where}run",
                         "node_name": "n1",
                         "mps": {"pipe_dir": f"{where}pipe", "log_dir": f"{where}log"},
                         "checks": {"only": ["directories"]},
                         "commands": {"scontrol": str(scontrol)},
                         "slurm": {"timeout_s": 1.0},
                         "healthcheck": {"fail_runs": 1, "pass_runs": 1, "boot_grace_s": 0,
                                         **healthcheck_keys},
                         "remediation": {"audit_log": f"{where}audit.log",
                                         "syslog": False}}, None)


def saved(tmp_path: Path, root: str = "") -> hcstate.HcState:
    base = Path(root) if root else tmp_path
    return hcstate.load(str(base / "state" / hcstate.STATE_FILE))


def test_a_run_with_nothing_to_change_makes_no_slurm_call(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"))
    for _ in range(3):
        r = healthcheck.run_once(cfg, "/", False, {})
        assert r.rc == OK and "node not drained by us; healthy" in r.lines[-1], r.lines
    assert lines_of(tmp_path, "calls") == []  # not one scontrol, in three runs


def test_a_drain_that_times_out_is_unknown_bounded_and_done_next_run(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"))
    (tmp_path / "pipe").chmod(0o700)  # directories fails: pipe-dir-mode (CRITICAL)
    (tmp_path / "hang").write_text("")
    t0 = time.monotonic()
    r = healthcheck.run_once(cfg, "/", False, {})
    took = time.monotonic() - t0
    assert took < 5.0, took  # one bounded call (1 s): the node read, never waited out
    text = "\n".join(r.lines)
    assert r.rc == CRITICAL  # the node's own fault still shows as it is
    assert "MPS UNKNOWN - healthcheck-slurm-failed: the drain was not done" in text, text
    assert "drain failed, will retry next run" in r.lines[-1]
    assert lines_of(tmp_path, "updates") == [] and not saved(tmp_path).drained
    (tmp_path / "hang").unlink()  # slurmctld back
    again = healthcheck.run_once(cfg, "/", False, {})
    assert "drained (" in again.lines[-1], again.lines
    assert lines_of(tmp_path, "updates")[0].startswith("update NodeName=n1 State=DRAIN")
    assert saved(tmp_path).drained


def test_a_resume_that_times_out_stays_owed_and_happens_once_back(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE+DRAIN",
                                                 f"{TAG} pipe-dir-mode node: x"))
    (tmp_path / "state" / hcstate.STATE_FILE).write_text("fails=0\npasses=0\ndrained=yes\n")
    (tmp_path / "hang").write_text("")
    t0 = time.monotonic()
    r = healthcheck.run_once(cfg, "/", False, {})
    assert time.monotonic() - t0 < 5.0
    assert r.rc == 3, r.lines  # UNKNOWN: our own trouble, not the node's
    assert any(x.startswith("MPS UNKNOWN - healthcheck-slurm-failed: the resume was not "
                            "done") and x.endswith("explain healthcheck-slurm-failed)")
               for x in r.lines), r.lines
    assert saved(tmp_path).drained  # the resume is still owed
    assert lines_of(tmp_path, "updates") == []
    (tmp_path / "hang").unlink()
    again = healthcheck.run_once(cfg, "/", False, {})
    assert again.rc == OK and "resumed (" in again.lines[-1], again.lines
    assert lines_of(tmp_path, "updates") == ["update NodeName=n1 State=RESUME"]
    assert not saved(tmp_path).drained


def test_the_run_duration_is_kept_and_said(tmp_path: Path) -> None:
    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"))
    r = healthcheck.run_once(cfg, "/", False, {})
    assert " took " in r.lines[-1] and r.lines[-1].endswith("s")
    state = saved(tmp_path)
    assert 0.0 < state.duration_s < 15.0
    assert "duration_s=" in (tmp_path / "state" / hcstate.STATE_FILE).read_text()
    assert hcstate.parse("fails=0\nduration_s=nan\n").duration_s == 0.0
    assert hcstate.parse("fails=0\nduration_s=-3\n").duration_s == 0.0


def test_a_slow_run_is_a_warning_naming_the_slowest_source() -> None:
    report = Report("n1", 0.0, 16.0, (), {"control": 14.2, "dirs": 0.01}, "0")
    assert healthcheck._slow(report, 15.0, 0.0) == []  # a quarter of 60 s is still fine
    line, = healthcheck._slow(report, 16.5, 0.5)
    assert line.startswith("MPS WARNING - healthcheck-slow: this run took 16.5s, over 15s "
                           "(a quarter of slurmd's 60s kill); slowest: control 14.2s"), line
    line, = healthcheck._slow(report, 30.0, 15.0)
    assert "slowest: slurmctld calls 15.0s" in line
    line, = healthcheck._slow(None, 30.0, 0.0)  # the checks hung: no source to name
    assert "slowest" not in line


def test_a_slow_run_warns_through_the_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(healthcheck, "SLOW_RUN_S", 0.0)
    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"))
    r = healthcheck.run_once(cfg, "/", False, {})
    assert r.rc == 1 and any(x.startswith("MPS WARNING - healthcheck-slow: ") and
                             "slowest: " in x for x in r.lines), r.lines
    assert "healthy" in r.lines[-1] and lines_of(tmp_path, "calls") == []  # never a drain


# --- boot grace --------------------------------------------------------------------------

def boot_tree(tmp_path: Path, uptime_s: float) -> str:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "uptime").write_text(f"{uptime_s:.2f} 1.00\n")
    return str(root)


def test_starting_marks_only_what_a_boot_explains() -> None:
    found = (Result("daemon", CRITICAL, "daemon-absent", "gpu0", "no daemon"),
             Result("directories", CRITICAL, "pipe-dir-mode", "gpu0", "mode 0700"),
             Result("directories", CRITICAL, "pipe-dir-missing", "gpu0", "none", cause="x"))
    runs = starting((CheckRun("c", found, 0.0),))
    absent, mode, folded = runs[0].results
    assert absent.cause == STARTING and not is_problem(absent) and absent.action == ""
    assert mode.cause == "" and is_problem(mode)  # a wrong mode is no boot's doing
    assert folded.cause == "x"  # folded under its own cause already: left


def test_a_booting_node_with_its_dirs_not_made_yet_is_not_drained(tmp_path: Path) -> None:
    scontrol = recording_scontrol(tmp_path, "IDLE")
    root = boot_tree(tmp_path, 42.0)
    cfg = hc_config(tmp_path, scontrol, root, boot_grace_s=300)
    for d in ("pipe", "log"):
        (Path(root) / d).rmdir()  # not made yet: pipe-dir-missing, log-dir-missing
    r = healthcheck.run_once(cfg, root, False, {})
    text = "\n".join(r.lines)
    assert r.rc == OK, text  # Nagios has no INITIALIZING: OK, with the line saying so
    assert "MPS-HC: INITIALIZING - booted 42s ago (healthcheck.boot_grace_s 300): still " \
        "starting, never drained: log-dir-missing node, pipe-dir-missing node" in text, text
    assert r.lines[-1].startswith("MPS-HC: starting;") and "is still starting" in r.lines[-1]
    assert lines_of(tmp_path, "calls") == []
    assert saved(tmp_path, root).fails == 0
    # A fault a boot does not explain still counts within the grace.
    (Path(root) / "pipe").mkdir(mode=0o700)
    (Path(root) / "pipe").chmod(0o700)
    bad = healthcheck.run_once(cfg, root, False, {})
    assert bad.rc == CRITICAL and "drained (" in bad.lines[-1], bad.lines
    # Past the grace, the same missing dirs drain.
    (Path(root) / "pipe").rmdir()
    (tmp_path / "calls").unlink()
    root2 = boot_tree(tmp_path, 301.0)
    late = healthcheck.run_once(cfg, root2, False, {})
    assert late.rc == CRITICAL and "INITIALIZING" not in "\n".join(late.lines)


def test_a_drain_of_ours_is_not_resumed_while_units_are_starting(tmp_path: Path) -> None:
    scontrol = recording_scontrol(tmp_path, "IDLE+DRAIN", f"{TAG} daemon-absent node: x")
    root = boot_tree(tmp_path, 10.0)
    cfg = hc_config(tmp_path, scontrol, root, boot_grace_s=300)
    (Path(root) / "state" / hcstate.STATE_FILE).write_text("fails=0\npasses=5\ndrained=yes\n")
    (Path(root) / "log").rmdir()
    for _ in range(2):
        r = healthcheck.run_once(cfg, root, False, {})
        assert r.rc == OK and r.lines[-1].startswith("MPS-HC: starting;"), r.lines
    assert lines_of(tmp_path, "calls") == [] and saved(tmp_path, root).drained


def test_the_last_run_duration_is_a_metric(tmp_path: Path) -> None:
    from mps_health.cli.exporter import healthcheck_duration
    from mps_health.exporters import prometheus

    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"))
    assert healthcheck_duration(cfg, "/") is None  # primed, never run: no series
    healthcheck.run_once(cfg, "/", False, {})
    took = healthcheck_duration(cfg, "/")
    assert took is not None and took == saved(tmp_path).duration_s
    page = prometheus.exposition(prometheus.RunRecord(None, 1.0, False, None,
                                                      healthcheck_s=took)).decode()
    assert f"mps_health_healthcheck_duration_seconds {took}" in page, page
    assert "healthcheck_duration" not in prometheus.exposition(
        prometheus.RunRecord(None, 1.0, False, None)).decode()


def test_a_run_that_lost_its_memory_still_exports_its_duration(tmp_path: Path) -> None:
    """No state file (a fresh node, a lost tmpfs) and a failed run: whether the node is
    drained by us is not known yet (known=no), yet the run took its time."""
    from mps_health.cli.exporter import healthcheck_duration

    cfg = hc_config(tmp_path, recording_scontrol(tmp_path, "IDLE"), fail_runs=2)
    (tmp_path / "state" / hcstate.STATE_FILE).unlink()
    (tmp_path / "pipe").chmod(0o700)  # directories fails: pipe-dir-mode, run 1 of 2
    healthcheck.run_once(cfg, "/", False, {})
    state = saved(tmp_path)
    assert not state.known and state.fails == 1
    assert healthcheck_duration(cfg, "/") == state.duration_s > 0


def test_every_starting_code_is_a_check_code() -> None:
    """The rule table names real codes (a renamed code would silently lose its grace)."""
    import importlib

    from mps_health.model.results import STARTING_CODES

    known = set()
    for module in ("daemon", "directories", "control", "servers", "gres_drift", "canary"):
        known |= set(importlib.import_module(f"mps_health.checks.{module}").CODES)
    assert known >= STARTING_CODES, STARTING_CODES - known
