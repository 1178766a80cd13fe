"""blockers: who holds a control daemon, judged from made facts (one assertion per code)."""

from typing import Optional, Tuple

from mps_health.checks import blockers
from mps_health.hostio.unblocks import Unblocked
from mps_health.model.facts import DirFact
from mps_health.model.results import CRITICAL, OK, WARNING
from mps_health.probes.blockers import BlockerFacts, Connection, Holder, Waiting

from .made import NODE, NOW, codes, one, proc, run

PIPE = {NODE.pipe_dir: DirFact(NODE.pipe_dir, "dir", 0o777, 0)}


def holder(pid: int, uid: int = 1001, user: Optional[str] = "alice", comm: str = "python3",
           job: Optional[str] = "77") -> Holder:
    return Holder(pid, uid, user, pid * 10, "S", 1, comm, job, None)


def waiting(*held: Holder, why: str = "", processes: Tuple[Holder, ...] = ()) -> Waiting:
    return Waiting("no answer within 3.0s", not why, why, (100,),
                   tuple(Connection(900 + i, 800 + i, (h,)) for i, h in enumerate(held)),
                   processes)


def judged(procs, wait: Optional[Waiting] = None, recent=()):
    found = BlockerFacts({NODE.name: wait} if wait is not None else {}, tuple(recent))
    return run(blockers, {"processes": tuple(procs), "dirs": PIPE, "control": {},
                          "blockers": found})


def test_nothing_holds_a_daemon_that_answers() -> None:
    assert codes(judged([proc(100)])) == [("node", OK, "ok")]


def test_an_idle_connection_is_named_with_user_job_and_the_unblock_step() -> None:
    r = one(judged([proc(100)], waiting(holder(812))), "blocked-connection")
    assert (r.state, r.code) == (CRITICAL, "blocked-connection")
    assert "control daemon 100 waits on a connection to its control socket held by pid 812 " \
           "(python3, user alice, uid 1001, job 77)" in r.message
    assert "mps-health remediate unblock node" in r.action and "never a reset" in r.action
    # One bounded series per instance: a count, never a pid or uid label.
    assert (r.values, r.labels) == ((("blockers", 1.0),), ())


def test_a_connection_of_root_is_named_but_left_to_a_person() -> None:
    r = one(judged([proc(100)], waiting(holder(812, uid=0, user="root"))), "blocked-connection")
    assert "runs as root" in r.action and "remediate unblock" not in r.action
    (b,) = blockers.find(NODE, (proc(100),), PIPE[NODE.pipe_dir],
                         waiting(holder(812, uid=0)))
    assert b.remedy == ""


def test_the_daemon_s_own_and_its_server_s_connections_are_no_blockers() -> None:
    procs = [proc(100), proc(200, "server", uid=1001, ppid=100)]
    results = judged(procs, waiting(holder(100, uid=0), holder(200)))
    assert codes(results) == [("node", OK, "ok")]


def test_a_stopped_server_of_the_instance_is_continued() -> None:
    procs = [proc(100), proc(200, "server", uid=1001, ppid=100, state="T")]
    r = one(judged(procs), "blocked-server")
    assert (r.state, r.code) == (CRITICAL, "blocked-server") and "MPS server pid 200 (uid 1001)" in r.message
    assert "is stopped (state T)" in r.message
    assert "kill -CONT 200" in r.action and "never a reset" in r.action
    assert [b.remedy for b in blockers.find(NODE, tuple(procs), PIPE[NODE.pipe_dir], None)] \
        == ["cont"]


def test_a_stopped_server_binary_the_daemon_did_not_start_is_ended_once_it_holds() -> None:
    procs = [proc(100), proc(300, "server", uid=1002, ppid=4000, state="T")]
    # While the daemon answers it is the strays check's business, not a blocker.
    assert codes(judged(procs)) == [("node", OK, "ok")]
    r = one(judged(procs, waiting(holder(300, uid=1002))), "blocked-foreign-server")
    assert (r.state, r.code) == (CRITICAL, "blocked-foreign-server") and "pid 300" in r.message and "did not start" in r.message
    assert "remediate unblock node" in r.action
    assert not [x for x in judged(procs, waiting(holder(300))) if x.code == "blocked-connection"]


def test_a_stopped_daemon_is_the_daemon_check_s_finding_but_unblock_continues_it() -> None:
    procs = (proc(100, state="T"),)
    assert codes(judged(procs)) == [("node", OK, "ok")]
    (b,) = blockers.find(NODE, procs, PIPE[NODE.pipe_dir], None)
    assert (b.kind, b.remedy) == ("daemon", "cont")


def test_no_answer_and_no_blocker_found_says_whether_one_can_be_ruled_out() -> None:
    (r,) = judged([proc(100)], waiting(why="the kernel gave no socket peers"))
    assert r.state == OK and "cannot be ruled out" in r.message
    (r,) = judged([proc(100)], waiting())
    assert r.state == OK and "nothing on the node holds it" in r.message


def test_a_uid_that_blocks_again_and_again_is_a_warning_naming_it() -> None:
    recent = [Unblocked(NOW - 60 * i, 1001, "alice", "node", "connection") for i in (30, 20, 10)]
    r = one(judged([proc(100)], recent=recent), "blocker-repeated")
    assert (r.state, r.code) == (WARNING, "blocker-repeated") and r.instance == ""
    assert "user alice, uid 1001 blocked MPS on this node 3 times" in r.message
    assert not [x for x in judged([proc(100)], recent=recent[:2]) if x.state]
