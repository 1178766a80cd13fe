"""Per-job instances are judged only once their job runs here and its MPS is set up.

The judging rule of mps_health.probes.jobphase end to end (the real CLI, a squeue stand-in for
Slurm's answer) and as pure functions: a dir whose job Slurm does not list, a job within
``slurm.job_grace_s`` of its start, a job CONFIGURING or COMPLETING, and a pipe dir our
Prolog or Epilog is working on are not judged; a job running past the grace whose
instance is broken is CRITICAL. Dirs are root's here (``mps.dir_owner: root``) so that
the verdict is not capped at WARNING as for dirs the job's user owns.
"""

import json
from pathlib import Path
from typing import List, Tuple

import pytest
from clirun import mps_health
from hostile import squeue_line
from mps_health.hostio import planned
from mps_health.model.facts_deep import PlannedRestart
from mps_health.probes.jobphase import PROLOG_LIMIT_S, SET_UP, TORN_DOWN, hook_phase, slurm_phase
from mps_health.probes.slurm import SlurmJob
from nodesite import Site
from paths import FAKE_CONTROL

JOB = "4711"


@pytest.fixture
def job_site(site: Site) -> Tuple[Path, Path]:
    """A per-job config over a sticky parent, and job 4711's dirs made as its Prolog
    would have made them, with no daemon running: judged, it is broken."""
    parent = site.sticky_tmp()
    for name in (f"nvidia-mps_job{JOB}", f"nvidia-log_job{JOB}"):
        (parent / name).mkdir(mode=0o700)
    config = site.config(site.per_job(dir_owner="root", daemon_user="root"),
                         commands={"squeue": site.squeue(),
                                   "nvidia-cuda-mps-control": FAKE_CONTROL},
                         slurm={"job_grace_s": 60})
    return Path(config), parent


def check(config: Path) -> Tuple[int, List[Tuple[str, str, str]]]:
    r = mps_health("check", "--config", str(config), "--only", "daemon,directories,control",
                   "--format", "json")
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    report = json.loads(r.stdout)
    return r.returncode, [(p["instance"], p["state"], p["code"]) for p in report["problems"]]


def slurm_lists(site: Site, state: str = "RUNNING", elapsed: str = "1:00:00") -> None:
    site.squeue(squeue_line(JOB, "root", 0, state, elapsed=elapsed))


def test_a_dir_whose_job_slurm_does_not_list_is_not_judged(job_site, site: Site) -> None:
    config, _ = job_site
    assert check(config) == (0, [])


def test_a_job_within_the_grace_is_not_judged(job_site, site: Site) -> None:
    config, _ = job_site
    slurm_lists(site, elapsed="0:59")
    assert check(config) == (0, [])


@pytest.mark.parametrize("state", ["CONFIGURING", "COMPLETING"])
def test_a_job_being_set_up_or_torn_down_by_slurm_is_not_judged(job_site, site: Site,
                                                                  state: str) -> None:
    config, _ = job_site
    slurm_lists(site, state)
    assert check(config) == (0, [])


def test_a_job_past_the_grace_with_a_broken_instance_is_critical(job_site, site: Site
                                                                 ) -> None:
    config, _ = job_site
    slurm_lists(site, elapsed="1:00")
    rc, found = check(config)
    assert rc == 2 and (f"job{JOB}", "CRITICAL", "control-absent") in found, found


def test_our_epilog_at_work_is_not_judged_until_a_new_prolog(job_site, site: Site) -> None:
    """Slurm still lists the job as RUNNING (its answer came before the job ended), but
    our Epilog recorded its tear-down before quitting the daemon."""
    config, parent = job_site
    state = str(site.root / "state")
    pipe = str(parent / f"nvidia-mps_job{JOB}")
    slurm_lists(site)
    assert planned.record(state, pipe, "prolog", 1234, 5678) == ""
    assert check(config)[0] == 2
    assert planned.record(state, pipe, "epilog") == ""
    assert check(config) == (0, [])
    # The job is requeued and its Prolog runs again: judged once it is done.
    assert planned.record(state, pipe, "prolog start") == ""
    assert planned.record(state, pipe, "prolog", 1235, 5679) == ""
    assert check(config)[0] == 2


def test_a_non_root_user_cannot_write_the_records(job_site, site: Site) -> None:
    """The records that spare an instance live in root's state dir."""
    _, parent = job_site
    planned.record(str(site.root / "state"), str(parent / "x"), "prolog")
    mode = (site.root / "state").stat().st_mode & 0o777
    assert mode & 0o022 == 0, oct(mode)
    files = list((site.root / "state").glob("planned*"))
    assert files and all(f.stat().st_mode & 0o022 == 0 and f.stat().st_uid == 0
                         for f in files)


# --- the rule as pure functions -----------------------------------------------------

def job(state: str = "RUNNING", elapsed: float = 3600.0) -> SlurmJob:
    return SlurmJob(JOB, "alice", 1000, state, elapsed, "gres:mps:10")


def test_slurm_phase() -> None:
    assert slurm_phase(job(), 60.0) == ""
    assert slurm_phase(job(elapsed=60.0), 60.0) == ""
    assert slurm_phase(job(elapsed=59.0), 60.0) == SET_UP
    assert slurm_phase(job("CONFIGURING"), 60.0) == SET_UP
    assert slurm_phase(job("COMPLETING"), 60.0) == TORN_DOWN
    assert slurm_phase(job("SUSPENDED"), 60.0) == "its job is suspended"
    assert slurm_phase(None, 60.0) != ""


def rec(by: str, at: float, pipe: str = "/tmp/p") -> PlannedRestart:
    return PlannedRestart(pipe, at, None, None, by)


def test_hook_phase() -> None:
    now = 1000.0
    assert hook_phase([], "/tmp/p", None, now, 60.0) == ""
    assert hook_phase([rec("reset", 990.0)], "/tmp/p", 995.0, now, 60.0) == ""
    assert hook_phase([rec("epilog", 10.0, "/tmp/q")], "/tmp/p", None, now, 60.0) == ""
    # The newest step decides: a tear-down holds until a new Prolog's.
    assert hook_phase([rec("prolog", 10.0), rec("epilog", 20.0)], "/tmp/p", None, now,
                      60.0) == TORN_DOWN
    assert hook_phase([rec("prolog undo", 20.0)], "/tmp/p", None, now, 60.0) == TORN_DOWN
    assert hook_phase([rec("epilog", 10.0), rec("prolog", 20.0)], "/tmp/p", None, now,
                      60.0) == ""
    # A Prolog at work (however late it started: an allocation's first step) is set-up
    # until it says it is done, for at most PROLOG_LIMIT_S (or the grace, if longer).
    assert hook_phase([rec("prolog start", 950.0)], "/tmp/p", None, now, 1.0) == SET_UP
    assert hook_phase([rec("prolog start", now - PROLOG_LIMIT_S - 1)], "/tmp/p", None, now,
                      60.0) == ""
    assert hook_phase([rec("prolog start", now - PROLOG_LIMIT_S - 1)], "/tmp/p", None, now,
                      PROLOG_LIMIT_S + 60) == SET_UP
    # A Prolog that finished while this run gathered: its facts may predate the daemon.
    assert hook_phase([rec("prolog", 996.0)], "/tmp/p", 995.0, now, 60.0) == SET_UP
    assert hook_phase([rec("prolog", 990.0)], "/tmp/p", 995.0, now, 60.0) == ""


def strays_orphaned(config: Path) -> List[Tuple[str, str, str]]:
    """The strays check's server-orphaned findings."""
    r = mps_health("check", "--config", str(config), "--only", "strays", "--format", "json")
    assert r.returncode in (0, 1, 2) and r.stderr == "", r.stdout + r.stderr
    return [(p["instance"], p["state"], p["code"]) for p in json.loads(r.stdout)["problems"]
            if p["code"] == "server-orphaned"]


@pytest.mark.private_pids  # strays judges every process: only this test's server is seen
def test_a_server_that_outlives_its_jobs_daemon_is_critical_only_once_the_job_ended(
        job_site, site: Site) -> None:
    """While Slurm lists the job, a server left by the job's daemon hurts only that job
    (its user may kill their own daemon): the job's WARNING. Once the job has ended it
    holds the GPU for nobody: the node's CRITICAL. Dirs and daemon root's here, so the
    WARNING is the check's own, not the engine's cap for a user's own MPS."""
    import os
    import signal
    import time

    from nodesite import Daemon
    from remhelp import alive

    config, parent = job_site
    slurm_lists(site)
    daemon = Daemon(parent / f"nvidia-mps_job{JOB}", parent / f"nvidia-log_job{JOB}",
                    {"FAKE_MPS_SERVER_OUTLIVES": "1"}, site.control)
    site.daemons.append(daemon)
    daemon.start()
    server = int(daemon.query("fake_server_start").stdout)
    try:
        assert strays_orphaned(config) == []  # served; the servers probe remembers it
        pid = daemon.pid
        daemon.stop()
        deadline = time.monotonic() + 30  # a bound for a stuck kill, not a timing
        while pid is not None and alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alive(server)  # it outlived its daemon
        assert strays_orphaned(config) == [(f"job{JOB}", "WARNING", "server-orphaned")]
        site.squeue()  # the job has ended
        assert strays_orphaned(config) == [("", "CRITICAL", "server-orphaned")]
    finally:
        os.kill(server, signal.SIGKILL)
