"""The orphans check on made facts: every code, and a dir only named like a job's is no orphan.

A dir is ours only when the Prolog recorded it for that job (hostio/jobrecords.py) and it
belongs to the recorded uid or root; anything else is at most ``orphan-unrecorded``.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from mps_health.config.load import from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.hostio.jobrecords import JobRecord
from mps_health.model.facts import Facts, ProcessFact
from mps_health.model.facts_deep import RememberedServer, ServerMemory, ServersFacts
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, Result
from mps_health.probes.jobdirs import JobDir, JobRecords
from mps_health.probes.slurm import SlurmFacts, SlurmJob, SlurmNode

NOW = 1_000_000.0
USER, STRANGER = 1001, 1002
CFG = {"mps": {"layout": "per-job", "pipe_dir": "/tmp/nvidia-mps_job{job}",
               "log_dir": "/tmp/nvidia-log_job{job}"},
       "slurm": {}, "orphans": {"min_age_s": 120}}
NODE = SlurmNode("n1", "MIXED", ("MIXED",), "", (), None)


def jd(job: str, role: str = "pipe", uid: int = USER, age: float = 3600.0,
       kind: str = "dir") -> JobDir:
    name = "mps" if role == "pipe" else "log"
    return JobDir(job, role, f"/tmp/nvidia-{name}_job{job}", kind, uid,
                  {0: "root", USER: "alice", STRANGER: "mallory"}.get(uid), NOW - age)


def rec(job: str, uid: int = USER) -> JobRecord:
    return JobRecord(job, uid, (f"/tmp/nvidia-log_job{job}", f"/tmp/nvidia-mps_job{job}"),
                     NOW - 7200)


def proc(pid: int, role: str, job: str, genuine: Optional[bool] = True,
         uid: int = USER) -> ProcessFact:
    name = "nvidia-cuda-mps-server" if role == "server" else "nvidia-cuda-mps-control"
    argv = (name,) if role == "server" else (name, "-d")
    return ProcessFact(pid, 1, "S", uid, role, argv, 100, f"/tmp/nvidia-mps_job{job}", True,
                       genuine)


def judge(dirs: Sequence[JobDir], records: Sequence[JobRecord] = (),
          procs: Sequence[ProcessFact] = (), alive: Sequence[str] = (),
          slurm: Optional[SlurmFacts] = None, error: str = "", denied: bool = False,
          config: Dict[str, Any] = CFG,
          remembered: Sequence[Tuple[int, int]] = ()) -> List[Result]:
    jobs = tuple(SlurmJob(j, "alice", USER, "RUNNING", 60.0, "gres:mps:50") for j in alive)
    sources = {"slurm": slurm or SlurmFacts("n1", NODE, jobs=jobs),
               "job_dirs": tuple(dirs), "processes": tuple(procs),
               "job_records": JobRecords(tuple(records), error, denied),
               "servers": ServersFacts(NOW, {}, {"job-old": ServerMemory(
                   NOW - 60, 40, 400, tuple(RememberedServer(pid, ticks, "ACTIVE", NOW - 60,
                                                             "alice", (), True)
                                            for pid, ticks in remembered))}, ())}
    facts = Facts("n1", NOW, "/", (), sources, {}, {})
    (run,) = engine.judge(facts, from_mapping(config, "site.yaml"), [registry.checks()["orphans"]])
    return list(run.results)


def codes(results: List[Result]) -> List[Tuple[str, int, str]]:
    return [(r.instance, r.state, r.code) for r in results]


def test_nothing_left_is_ok() -> None:
    results = judge([jd("7")], [rec("7")], alive=["7"])
    assert codes(results) == [("", OK, "ok")]
    assert "1 job dirs, 1 jobs on n1" in results[0].message


def test_recorded_dirs_of_an_ended_job_are_orphan_dir() -> None:
    (r,) = judge([jd("12"), jd("12", "log")], [rec("12")])
    assert (r.instance, r.state, r.code) == ("job12", WARNING, "orphan-dir")
    assert "job 12 (owner alice)" in r.message and "60m old" in r.message
    assert "log dir /tmp/nvidia-log_job12" in r.message


def test_recorded_dirs_made_root_s_are_still_ours() -> None:
    # The Prolog may leave a dir root's; a removal that stopped half-way leaves it so.
    assert codes(judge([jd("12", uid=0)], [rec("12")])) == [("job12", WARNING, "orphan-dir")]


def test_a_genuine_server_in_a_recorded_dir_is_critical() -> None:
    """Critical when a daemon was seen with it: remembered as its daemon's child."""
    (r,) = judge([jd("12")], [rec("12")], [proc(50, "server", "12")], remembered=[(50, 100)])
    assert (r.instance, r.state, r.code) == ("job12", CRITICAL, "orphan-server")
    assert "its MPS server 50 still holds the GPU" in r.message


def test_a_server_no_daemon_was_seen_with_is_a_warning() -> None:
    (r,) = judge([jd("12")], [rec("12")], [proc(50, "server", "12")])
    assert (r.state, r.code) == (WARNING, "orphan-server")
    assert "a process named like its MPS server (50) still runs (no daemon was seen with it" \
        in r.message


def test_a_server_is_critical_only_while_a_daemon_vouches_for_it() -> None:
    """Its daemon's child vouches as the servers' memory does; a server held (traced,
    stopped) or one whose binary is unread proves nothing, remembered or not."""
    server = proc(50, "server", "12")
    child = [proc(40, "control", "12"), server._replace(ppid=40)]
    (r,) = judge([jd("12")], [rec("12")], child)
    assert (r.state, r.code) == (CRITICAL, "orphan-server")
    for held in (server._replace(traced=True), server._replace(state="t"),
                 server._replace(genuine=None)):
        found = judge([jd("12")], [rec("12")], [held], remembered=[(50, 100)])
        assert codes(found) == [("job12", WARNING, "orphan-server")], held
        assert "no daemon was seen with it, it is held" in found[0].message


def test_a_server_whose_binary_is_unknown_is_a_warning() -> None:
    (r,) = judge([jd("12")], [rec("12")], [proc(50, "server", "12", genuine=None)])
    assert (r.state, r.code) == (WARNING, "orphan-server")
    assert "could not be checked" in r.message


def test_a_leftover_daemon_is_orphan_daemon() -> None:
    (r,) = judge([jd("12")], [rec("12")], [proc(40, "control", "12")])
    assert (r.instance, r.state, r.code) == ("job12", WARNING, "orphan-daemon")
    assert r.message.endswith("; its control daemon 40 still runs")


def test_each_leftover_names_the_command_that_removes_it() -> None:
    """An ended job is no instance: 'remediate reset jobN' would answer that it names
    none. 'remediate orphans' selects recorded leftovers of ended jobs, as this check does."""
    found = judge([jd("12"), jd("13"), jd("14")], [rec("12"), rec("13"), rec("14")],
                  [proc(40, "control", "13"), proc(50, "server", "14")],
                  remembered=[(50, 100)])
    assert [r.code for r in found] == ["orphan-dir", "orphan-daemon", "orphan-server"]
    for r in found:
        assert "'mps-health remediate orphans --dry-run'" in r.action, r.code
        assert r.action.endswith("then 'mps-health remediate orphans'"), r.code
        assert "remediate reset" not in r.action, r.code


def test_a_running_jobs_server_without_its_daemon_is_no_orphan() -> None:
    """Its job still runs: the strays check judges it as that job's WARNING."""
    found = judge([jd("12")], [rec("12")], [proc(50, "server", "12")], alive=["12"],
                  remembered=[(50, 100)])
    assert codes(found) == [("", OK, "ok")]


def test_young_and_alive_are_not_judged() -> None:
    assert codes(judge([jd("12", age=30)], [rec("12")])) == [("", OK, "ok")]
    assert codes(judge([jd("12", age=30, uid=STRANGER)])) == [("", OK, "ok")]
    assert codes(judge([jd("12", uid=STRANGER)], alive=["12"])) == [("", OK, "ok")]


def test_a_job_named_dir_nobody_recorded_is_no_orphan_even_with_a_server() -> None:
    """The attack: a back-dated dir named like an ended job's, a real-looking server in it."""
    results = judge([jd("12", uid=STRANGER), jd("12", "log", uid=STRANGER)], [],
                    [proc(50, "server", "12", uid=STRANGER)])
    assert codes(results) == [("", WARNING, "orphan-unrecorded")]
    (r,) = results
    assert "owned by mallory (uid 1002)" in r.message and "2 entries" in r.message
    assert "never removed by mps-health" in r.message
    assert "rm -rf --one-file-system -- /tmp/nvidia-log_job12" in r.action
    assert dict(r.labels) == {"uid": "1002"}


def test_a_recorded_name_owned_by_another_uid_is_not_ours() -> None:
    # Recorded for alice, but the dir there now is mallory's: a squat after the Epilog.
    results = judge([jd("12", uid=STRANGER)], [rec("12")], [proc(50, "server", "12")])
    assert codes(results) == [("", WARNING, "orphan-unrecorded")]


def test_a_record_of_another_job_does_not_cover_a_name() -> None:
    assert codes(judge([jd("13")], [rec("12")])) == [("", WARNING, "orphan-unrecorded")]


def test_unrecorded_dirs_are_one_line_per_owner_and_bounded() -> None:
    dirs = [jd(str(100 + i), uid=STRANGER) for i in range(500)] + [jd("99", uid=USER)]
    results = judge(dirs)
    assert codes(results) == [("", WARNING, "orphan-unrecorded")] * 2
    stranger = next(r for r in results if "uid 1002" in r.message)
    assert "500 entries" in stranger.message and "and 497 more" in stranger.message
    assert len(stranger.message) < 400


def test_ours_and_strangers_side_by_side() -> None:
    results = judge([jd("12"), jd("13", uid=STRANGER)], [rec("12")],
                    [proc(50, "server", "13", uid=STRANGER)])
    assert codes(results) == [("job12", WARNING, "orphan-dir"),
                              ("", WARNING, "orphan-unrecorded")]


@pytest.mark.parametrize("denied,state", [(False, WARNING), (True, UNKNOWN)])
def test_unreadable_records(denied: bool, state: int) -> None:
    error = "job records not read: /var/lib/mps-health/jobs.json is owned by uid 1002"
    results = judge([], error=error, denied=denied)
    assert codes(results) == [("", state, "job-records-unreadable")]
    assert error in results[0].message
    # Nothing can be told to be ours: every leftover is a stranger's, none CRITICAL.
    results = judge([jd("12")], [], [proc(50, "server", "12")], error=error, denied=denied)
    assert codes(results) == [("", state, "job-records-unreadable"),
                              ("", WARNING, "orphan-unrecorded")]


def test_slurm_unavailable() -> None:
    down = SlurmFacts("n1", None, "unreachable", "slurmctld did not answer")
    assert codes(judge([jd("12")], [rec("12")], slurm=down)) == [
        ("", UNKNOWN, "slurm-unavailable")]
    no_jobs = SlurmFacts("n1", NODE, jobs=None, jobs_error="squeue timed out")
    (r,) = judge([jd("12")], [rec("12")], slurm=no_jobs)
    assert (r.state, r.code) == (UNKNOWN, "slurm-unavailable")
    assert "squeue timed out" in r.message


def test_other_layouts_have_no_orphans() -> None:
    cfg = {"slurm": {}, "orphans": {}}
    assert codes(judge([jd("12", uid=STRANGER)], config=cfg)) == [("", OK, "ok")]

