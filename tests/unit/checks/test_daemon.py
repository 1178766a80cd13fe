"""The daemon check on made facts: every code, and daemon_up, which is 1 only for a daemon
that can serve: a stopped one, or one that gave the run's control query no answer, is
counted down by the fleet alert."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import pytest
from mps_health.checks import daemon
from mps_health.config.load import from_mapping
from mps_health.model.facts import ControlAnswer, DirFact, EntryFact, Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, OK, WARNING
from mps_health.probes.control import QUERY as Q

from .made import JOB, NODE, codes, dirs_of, pipe_dir, proc, run

INST = Instance("gpu0", "per-gpu", "/tmp/mpsh-unit/pipe0", "/tmp/mpsh-unit/log0", gpu="0")
TIMED_OUT = ControlAnswer(Q, "timeout", None, "", "", 2.0, "no answer within 2.0s")


def _daemon_facts(state: str, answer: ControlAnswer) -> Facts:
    proc = ProcessFact(4242, 1, state, 0, "control", ("nvidia-cuda-mps-control", "-d"), 99,
                       INST.pipe_dir, True)
    pipe = DirFact(INST.pipe_dir, "dir", 0o777, 0, 0, pid_file="4242")
    return Facts("n1", 0.0, "/", (INST,), {"processes": (proc,), "dirs": {INST.pipe_dir: pipe},
                                           "control": {INST.name: answer}}, {}, {})


def test_a_daemon_that_gave_no_answer_is_not_up() -> None:
    cfg = from_mapping({}, None)
    (wedged,) = daemon.check(_daemon_facts("S", TIMED_OUT), cfg)
    assert wedged.state == OK and dict(wedged.values)["daemon_up"] == 0.0
    assert "did not answer this run's query" in wedged.message
    answered = ControlAnswer(Q, "ok", 0, "100.0\n", "", 0.01)
    (up,) = daemon.check(_daemon_facts("S", answered), cfg)
    assert dict(up.values)["daemon_up"] == 1.0
    (stopped,) = daemon.check(_daemon_facts("T", TIMED_OUT), cfg)
    assert stopped.code == "daemon-stopped" and dict(stopped.values)["daemon_up"] == 0.0


# --- every code, on made facts ------------------------------------------------------

RESET = "'mps-health remediate reset node' (dry run first: --dry-run)"
EVIL = 1001


def judge(procs: Sequence[ProcessFact], pipe: Optional[DirFact] = None,
          cfg: Optional[Dict[str, Any]] = None, answer: Optional[ControlAnswer] = None,
          **extra: Any) -> list:
    dirs = dirs_of(NODE, **({NODE.pipe_dir: pipe} if pipe else {}))
    sources: Dict[str, object] = {"processes": tuple(procs), "dirs": dirs}
    if answer is not None:
        sources["control"] = {"node": answer}
    return run(daemon, sources, cfg=cfg, **extra)


def test_one_live_daemon_is_ok_and_up() -> None:
    (r,) = judge([proc(4242)])
    assert (r.state, r.code) == (OK, "ok")
    assert "control daemon 4242 serves /tmp/nvidia-mps" in r.message
    assert dict(r.values) == {"daemon_up": 1.0, "daemon_pid": 4242.0}


def test_no_daemon_and_nothing_left_behind_is_absent() -> None:
    (r,) = judge([proc(4242, "server")])
    assert (r.state, r.code) == (CRITICAL, "daemon-absent")
    assert "no nvidia-cuda-mps-control serves /tmp/nvidia-mps" in r.message
    assert RESET in r.action and dict(r.values) == {"daemon_up": 0.0}


def test_a_pid_file_and_socket_without_their_daemon_are_stale() -> None:
    left = pipe_dir(entries=(EntryFact("control", "socket", 0o777, 0),), pid_file="4242")
    (r,) = judge([], left)
    assert (r.state, r.code) == (CRITICAL, "daemon-stale")
    assert "pid file names 4242, which is not a live daemon" in r.message
    assert "control socket left behind" in r.message and RESET in r.action


def test_a_per_job_daemon_missing_is_a_warning() -> None:
    found = run(daemon, {"processes": (), "dirs": dirs_of(JOB)}, (JOB,))
    assert codes(found) == [("job77", WARNING, "daemon-absent")]


def test_two_daemons_on_one_dir_are_duplicates() -> None:
    (r,) = judge([proc(4242), proc(4243)])
    assert (r.state, r.code) == (CRITICAL, "daemon-duplicate")
    assert "2 control daemons share /tmp/nvidia-mps (pids 4242, 4243)" in r.message


@pytest.mark.parametrize("state, severity, code, wording", [
    ("T", CRITICAL, "daemon-stopped", "is stopped (state T): every client and query hangs"),
    ("t", CRITICAL, "daemon-stopped", "is stopped (state t)"),
    ("D", WARNING, "daemon-uninterruptible", "is in uninterruptible sleep (state D)"),
])
def test_a_daemon_that_cannot_serve(state: str, severity: int, code: str, wording: str) -> None:
    (r,) = judge([proc(4242, state=state)])
    assert (r.state, r.code) == (severity, code)
    assert f"control daemon 4242 {wording}" in r.message
    # A stopped daemon is continued, never reset: its servers' jobs go on.
    assert ("kill -CONT 4242" in r.action and RESET not in r.action) if code == "daemon-stopped" \
        else RESET in r.action


def test_a_root_daemon_where_per_user_daemons_are_required() -> None:
    (r,) = judge([proc(4242)], cfg={"mps": {"forbid_root_daemon": True}})
    assert (r.state, r.code) == (CRITICAL, "daemon-root")
    assert "runs as root where per-user daemons are required" in r.message


def test_a_control_process_of_another_uid_is_foreign_never_the_daemon() -> None:
    found = judge([proc(666, uid=EVIL)])
    assert [(r.state, r.code) for r in found] == [(WARNING, "daemon-foreign"),
                                                  (CRITICAL, "daemon-absent")]
    assert "control process 666 of uid 1001 names /tmp/nvidia-mps, whose daemon runs as " \
        "uid 0: it is not counted as the daemon" in found[0].message
    assert "ps -o pid,user,lstart,args -p 666" in found[0].action


def test_no_control_binary_is_mps_not_installed() -> None:
    missing = ControlAnswer(Q, "exec-failed", None, "", "", 0.0,
                            "nvidia-cuda-mps-control: command not found")
    (r,) = judge([], answer=missing)
    assert (r.state, r.code) == (CRITICAL, "mps-not-installed")
    assert "MPS is not installed on this node (nvidia-cuda-mps-control: command not found)" \
        in r.message
    assert "a reset cannot help" in r.action


def test_instances_over_the_cap_are_said_once_for_the_node() -> None:
    found = judge([proc(4242)], instances_over_cap=3)
    assert codes(found)[-1] == ("", WARNING, "instances-capped")
    assert "3 more per-job instances than mps.max_instances" in found[-1].message


def test_no_instance_is_ok() -> None:
    assert codes(run(daemon, {"processes": (), "dirs": {}}, ())) == [("", OK, "ok")]


def test_where_environ_is_unreadable_the_pid_file_names_the_daemon() -> None:
    unread = proc(4242, pipe_dir=None, environ_readable=False)
    (r,) = judge([unread], pipe_dir(pid_file="4242"))
    assert (r.state, r.code) == (OK, "ok")
    # A pid file naming a process whose environ could be read, and names another dir,
    # is only a hint that disagrees: no daemon here.
    other = proc(4242, pipe_dir="/srv/other")
    assert [x.code for x in judge([other], pipe_dir(pid_file="4242"))] == ["daemon-stale"]
