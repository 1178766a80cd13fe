"""The strays check on made facts: which daemon-less server is CRITICAL, which is only
the WARNING ``server-unclaimed``; the servers' memory that tells them apart; impostors
and daemons on pipe dirs no instance uses. (Orphaned per-job servers: test_orphans.py.)"""

from typing import Dict, Iterable, List, Optional, Tuple

from mps_health.checks import strays
from mps_health.config.load import from_mapping
from mps_health.model.facts import Facts, Instance, ProcessFact
from mps_health.model.facts_deep import (
    InstanceServers,
    RememberedServer,
    ServerFact,
    ServerMemory,
    ServersFacts,
)
from mps_health.model.results import CRITICAL, OK, WARNING, Result
from mps_health.probes.proc import parse_status_traced
from mps_health.probes.process_identity import proves_nothing
from mps_health.probes.servertrack import advance, remembered

PIPE = "/tmp/nvidia-mps"
EVIL = 1001


def server(pid: int, *, uid: int = 0, ppid: int = 1, state: str = "S", traced: bool = False,
           genuine: Optional[bool] = True, pipe_dir: Optional[str] = PIPE,
           start: Optional[int] = None) -> ProcessFact:
    return ProcessFact(pid, ppid, state, uid, "server", ("nvidia-cuda-mps-server", ""),
                       pid * 10 if start is None else start, pipe_dir, True, genuine, traced)


def daemon(pid: int, pipe_dir: str = PIPE) -> ProcessFact:
    return ProcessFact(pid, 1, "S", 0, "control", ("nvidia-cuda-mps-control", "-d"), pid * 10,
                       pipe_dir, True, True)


def memory(*pids: int, daemon_pid: Optional[int] = 100, child: bool = True) -> ServerMemory:
    return ServerMemory(1000.0, daemon_pid, 1000 if daemon_pid else None,
                        tuple(RememberedServer(p, p * 10, "ACTIVE", 1000.0, "root", (), child)
                              for p in pids))


def servers_facts(previous: Dict[str, ServerMemory]) -> ServersFacts:
    return ServersFacts(2000.0, {}, previous, ())


def run_strays(procs: Iterable[ProcessFact],
               previous: Optional[Dict[str, ServerMemory]] = None,
               instances: Tuple[Instance, ...] = (), cfg: Optional[dict] = None,
               unjudged: Tuple[Tuple[str, str], ...] = ()) -> List[Result]:
    facts = Facts("n1", 2000.0, "/", instances, {"processes": tuple(procs),
                                                 "servers": servers_facts(previous or {})},
                  {}, {}, unjudged=unjudged)
    return list(strays.check(facts, from_mapping(cfg or {}, "site.yaml")))


def codes(results: List[Result]) -> List[Tuple[int, str]]:
    return [(r.state, r.code) for r in results]


# --- strays ---------------------------------------------------------------------------

def test_a_remembered_genuine_server_without_its_daemon_is_critical() -> None:
    found = run_strays([server(4242)], {"node": memory(4242)})
    assert codes(found) == [(CRITICAL, "server-orphaned")]
    assert "nvidia-cuda-mps-server 4242 (uid 0)" in found[0].message
    assert "mps-health remediate reset" in found[0].action


def test_a_server_no_daemon_was_seen_with_is_a_warning() -> None:
    found = run_strays([server(4242, uid=EVIL)])
    assert codes(found) == [(WARNING, "server-unclaimed")]
    assert "uid 1001" in found[0].message and "4242" in found[0].message
    assert f"on {PIPE}" in found[0].message
    assert "ls -l /proc/4242/exe" in found[0].action and "do not reset" in found[0].action


def test_the_same_pid_started_again_is_not_remembered() -> None:
    """A server is (pid, start ticks): a reused PID is another process."""
    found = run_strays([server(4242, start=99)], {"node": memory(4242)})
    assert codes(found) == [(WARNING, "server-unclaimed")]


def test_a_traced_server_proves_nothing_even_if_remembered() -> None:
    found = run_strays([server(4242, traced=True)], {"node": memory(4242)})
    assert codes(found) == [(WARNING, "server-unclaimed")]
    assert "1 of them traced or stopped" in found[0].message


def test_a_stopped_server_proves_nothing_even_if_remembered() -> None:
    for state in ("T", "t"):
        found = run_strays([server(4242, state=state)], {"node": memory(4242)})
        assert codes(found) == [(WARNING, "server-unclaimed")], state


def test_an_unchecked_binary_is_a_warning_saying_so() -> None:
    found = run_strays([server(4242, genuine=None)], {"node": memory(4242)})
    assert codes(found) == [(WARNING, "server-unclaimed")]
    assert "could not be checked" in found[0].message


def test_a_memory_that_named_no_daemon_vouches_for_nothing() -> None:
    """Servers listed by whatever answered on the socket, with no daemon in /proc."""
    found = run_strays([server(4242)], {"node": memory(4242, daemon_pid=None)})
    assert codes(found) == [(WARNING, "server-unclaimed")]


def test_a_server_beside_its_live_daemon_is_no_stray() -> None:
    def servers_found(procs: List[ProcessFact]) -> List[Result]:
        # (no instance is configured here: the daemon itself is daemon-unexpected)
        return [r for r in run_strays(procs) if r.code != "daemon-unexpected"]

    assert servers_found([daemon(100), server(4242, ppid=100)]) == []
    # Another dir, but the daemon's child; the daemon's dir, not its child.
    assert servers_found([daemon(100), server(4242, ppid=100, pipe_dir="/x")]) == []
    assert servers_found([daemon(100), server(4242, uid=EVIL)]) == []
    assert codes(run_strays([])) == [(OK, "ok")]


def test_thousands_of_a_users_servers_are_one_line_per_uid() -> None:
    mine = [server(5000 + i, uid=EVIL, traced=True, pipe_dir=f"/tmp/e{i % 4}")
            for i in range(2000)]
    other = [server(9000, uid=1002)]
    found = run_strays([*mine, *other], {"node": memory(4242)})
    assert codes(found) == [(WARNING, "server-unclaimed")] * 2
    first = found[0].message
    assert first.startswith("2000 nvidia-cuda-mps-server process(es) of uid 1001")
    assert "pids 5000, 5001, 5002, 5003, 5004 and 1995 more" in first
    assert "on /tmp/e0, /tmp/e1, /tmp/e2:" in first  # at most three dirs named
    assert "2000 of them traced or stopped" in first
    assert "uid 1002" in found[1].message and "9000" in found[1].message


def test_remembered_and_unclaimed_side_by_side() -> None:
    found = run_strays([server(4242), server(5000, uid=EVIL, traced=True)],
                       {"node": memory(4242)})
    assert codes(found) == [(CRITICAL, "server-orphaned"), (WARNING, "server-unclaimed")]


# --- a held server on a live daemon's pipe dir ---------------------------------------

def held_codes(procs: List[ProcessFact]) -> List[Tuple[int, str]]:
    # (no instance is configured here: the daemon itself is daemon-unexpected)
    return [c for c in codes(run_strays(procs)) if c[1] != "daemon-unexpected"]


def test_a_stopped_foreign_server_on_a_live_daemons_pipe_dir_is_named() -> None:
    """The user's way to hang the daemon and every client: the genuine binary run on the
    instance's pipe dir and stopped (or held under ptrace) before it does anything."""
    for held in ({"state": "T"}, {"state": "t"}, {"traced": True}):
        found = [r for r in run_strays([daemon(100), server(4242, uid=EVIL, **held)])
                 if r.code != "daemon-unexpected"]
        assert codes(found) == [(WARNING, "server-stopped-foreign")], held
        r = found[0]
        assert r.instance == ""
        assert r.message == ("1 stopped or traced nvidia-cuda-mps-server process(es) of uid "
                             f"1001 on {PIPE}, not started by its control daemon (pids 4242): "
                             "while one lives, the control daemon and its clients may hang")
        assert "'mps-health remediate unblock'" in r.action
        assert "'ps -o pid,user,lstart,stat,args -p 4242'" in r.action
        assert "remediate reset" not in r.action and "do not reset" in r.action


def test_the_daemons_own_held_server_is_no_foreign_one() -> None:
    assert held_codes([daemon(100), server(4242, ppid=100, state="T")]) == []
    assert held_codes([daemon(100), server(4242, ppid=100, traced=True)]) == []


def test_the_child_of_another_daemon_is_foreign_on_this_one() -> None:
    """Not *that* daemon's child: a daemon on another dir vouches for nothing here."""
    found = held_codes([daemon(100), daemon(200, "/srv/x"), server(4242, ppid=200,
                                                                   state="T")])
    assert found == [(WARNING, "server-stopped-foreign")]


def test_a_running_foreign_server_on_the_pipe_dir_is_left_as_before() -> None:
    assert held_codes([daemon(100), server(4242, uid=EVIL)]) == []
    assert held_codes([daemon(100), server(4242, uid=EVIL, state="D")]) == []


def test_only_the_genuine_binary_is_a_held_server() -> None:
    """An unchecked binary (not root) is left out; another binary is an impostor."""
    assert held_codes([daemon(100), server(4242, uid=EVIL, state="T", genuine=None)]) == []
    assert held_codes([daemon(100), server(4242, uid=EVIL, state="T", genuine=False)]) == [
        (WARNING, "mps-impostor")]


def test_held_servers_are_one_line_per_uid_with_bounded_pids() -> None:
    mine = [server(5000 + i, uid=EVIL, state="T") for i in range(2000)]
    found = held_codes([daemon(100), daemon(200, "/srv/x"), *mine,
                        server(9000, uid=1002, traced=True, pipe_dir="/srv/x")])
    assert found == [(WARNING, "server-stopped-foreign")] * 2
    lines = [r.message for r in run_strays([daemon(100), daemon(200, "/srv/x"), *mine,
                                            server(9000, uid=1002, traced=True,
                                                   pipe_dir="/srv/x")])
             if r.code == "server-stopped-foreign"]
    assert lines[0].startswith("2000 stopped or traced nvidia-cuda-mps-server process(es) "
                               f"of uid 1001 on {PIPE},")
    assert "(pids 5000, 5001, 5002, 5003, 5004 and 1995 more)" in lines[0]
    assert "uid 1002 on /srv/x" in lines[1] and "(pids 9000)" in lines[1]


def test_a_held_server_never_drains_the_node() -> None:
    from mps_health.healthcheck.slurmnode import NOT_COUNTED, by_any_user

    (r,) = [r for r in run_strays([daemon(100), server(4242, uid=EVIL, state="T")])
            if r.code == "server-stopped-foreign"]
    assert by_any_user(r) and "server-stopped-foreign" in NOT_COUNTED


# --- per-job: a server that outlives its job's daemon ------------------------------------

PER_JOB = {"mps": {"layout": "per-job", "pipe_dir": "/tmp/nvidia-mps_job{job}",
                   "log_dir": "/tmp/nvidia-log_job{job}"}}
JOB_PIPE = "/tmp/nvidia-mps_job77"
JOB77 = Instance("job77", "per-job", JOB_PIPE, "/tmp/nvidia-log_job77", job_id="77")


def job_server(pipe_dir: str = JOB_PIPE) -> ProcessFact:
    """A job's server, its daemon gone (its user's, as a per-job daemon's may be)."""
    return server(4242, uid=EVIL, pipe_dir=pipe_dir)


def test_a_running_jobs_server_without_its_daemon_is_the_jobs_warning() -> None:
    """The job's user may kill their own daemon: only their job is hurt, no drain."""
    found = run_strays([job_server()], {"job77": memory(4242)}, (JOB77,), PER_JOB)
    assert [(r.instance, r.state, r.code) for r in found] == [
        ("job77", WARNING, "server-orphaned")]
    assert "the job still runs" in found[0].message and JOB_PIPE in found[0].message
    assert "'mps-health remediate reset job77'" in found[0].action


def test_a_job_whose_mps_is_torn_down_still_runs() -> None:
    """Slurm lists the job (COMPLETING: the Epilog quits the daemon first): not ended."""
    found = run_strays([job_server()], {"job77": memory(4242)}, (), PER_JOB,
                       unjudged=(("77", "its MPS is being torn down"),))
    assert [(r.instance, r.state, r.code) for r in found] == [
        ("job77", WARNING, "server-orphaned")]
    gpu = run_strays([job_server(pipe_dir="/tmp/nvidia-mps_job77-1")],
                     {"job77": memory(4242)}, (), {"mps": {
                         "layout": "per-job", "pipe_dir": "/tmp/nvidia-mps_job{job}-{gpu}",
                         "log_dir": "/tmp/nvidia-log_job{job}-{gpu}"}},
                     unjudged=(("77", "its MPS is being set up"),))
    assert [(r.instance, r.state) for r in gpu] == [("job77-gpu1", WARNING)]


def test_once_the_job_has_ended_its_server_is_critical() -> None:
    found = run_strays([job_server()], {"job77": memory(4242)}, (), PER_JOB)
    assert [(r.instance, r.state, r.code) for r in found] == [("", CRITICAL, "server-orphaned")]
    # Another job's instance, or another job torn down, is not this one's.
    other = Instance("job78", "per-job", "/tmp/nvidia-mps_job78", "/tmp/nvidia-log_job78",
                     job_id="78")
    assert codes(run_strays([job_server()], {"job77": memory(4242)}, (other,), PER_JOB,
                            unjudged=(("78", "its MPS is being torn down"),))) == [
        (CRITICAL, "server-orphaned")]


def test_the_engine_keeps_a_running_jobs_server_a_warning_whoever_owns_the_dirs() -> None:
    """engine.judge lowers a per-job CRITICAL only where the job's user owns its MPS; this
    WARNING holds for root-owned per-job MPS too."""
    from mps_health.engine import registry
    from mps_health.engine import run as engine

    facts = Facts("n1", 2000.0, "/", (JOB77,), {"processes": (job_server(),),
                                                "servers": servers_facts(
                                                    {"job77": memory(4242)})}, {}, {})
    cfg = from_mapping({"mps": {**PER_JOB["mps"], "dir_owner": "root",
                                "daemon_user": "root"}}, "site.yaml")
    (run,) = engine.judge(facts, cfg, [registry.checks()["strays"]])
    assert [(r.instance, r.state, r.code) for r in run.results] == [
        ("job77", WARNING, "server-orphaned")]


# --- the facts and the memory -----------------------------------------------------------

def test_tracer_pid_is_read_from_status() -> None:
    assert parse_status_traced("Name:\tx\nTracerPid:\t3990\nUid:\t0\t0\t0\t0\n")
    assert not parse_status_traced("Name:\tx\nTracerPid:\t0\nUid:\t0\t0\t0\t0\n")
    assert not parse_status_traced("Name:\tx\n")


def test_proves_nothing() -> None:
    assert proves_nothing(server(1, traced=True))
    assert proves_nothing(server(1, state="T")) and proves_nothing(server(1, state="t"))
    assert not proves_nothing(server(1)) and not proves_nothing(server(1, state="D"))


def test_remembered_are_the_daemons_children_of_memories_that_named_a_daemon() -> None:
    assert remembered({"a": memory(1, 2), "b": memory(3, daemon_pid=None),
                       "c": memory(4), "d": memory(5, child=False)}) == {(1, 10), (2, 20), (4, 40)}


def test_a_listed_server_that_was_no_child_of_the_daemon_vouches_for_nothing() -> None:
    """Whatever answers on a 0777 pipe dir's socket may list a user's own process."""
    found = run_strays([server(4242, uid=EVIL)], {"node": memory(4242, child=False)})
    assert codes(found) == [(WARNING, "server-unclaimed")]


def test_advance_marks_the_daemons_children_and_keeps_the_mark() -> None:
    first = advance(None, _listed(7, 8), (), 1000.0, 3600, children=((7, 70),))
    assert {s.pid: s.daemon_child for s in first.servers} == {7: True, 8: False}
    later = advance(first, _listed(7, 8), (), 1100.0, 3600)  # once seen, it stays so
    assert {s.pid: s.daemon_child for s in later.servers} == {7: True, 8: False}


def _listed(*pids: int, daemon_pid: int = 100) -> InstanceServers:
    return InstanceServers("ok", "", daemon_pid, 1000, tuple(
        ServerFact(p, "ACTIVE", "", 0, "root", p * 10, ()) for p in pids), 0.01)


def test_a_living_server_the_new_daemon_does_not_list_stays_remembered() -> None:
    """The daemon was restarted without it: still a real daemon's server, and not
    gone, so no churn; once it ends it is forgotten."""
    first = advance(None, _listed(7), (), 1000.0, 3600, children=((7, 70),))
    restarted = _listed(daemon_pid=101)
    kept = advance(first, restarted, (), 1100.0, 3600, servers_alive=((7, 70),))
    assert [(s.pid, s.start_ticks) for s in kept.servers] == [(7, 70)]
    assert [e.code for e in kept.events] == ["daemon-restarted"]
    again = advance(kept, restarted, (), 1200.0, 3600, servers_alive=((7, 70),))
    assert [(s.pid, s.start_ticks) for s in again.servers] == [(7, 70)]
    assert [e.code for e in again.events] == ["daemon-restarted"]  # no new event
    gone = advance(again, restarted, (), 1300.0, 3600)
    assert gone.servers == ()
    # The idle daemon (no child, nothing asked) keeps it too.
    idle = InstanceServers("idle", "", 101, 1000, (), 0.0)
    assert advance(first, idle, (), 1100.0, 3600, servers_alive=((7, 70),)).servers \
        == first.servers


# --- the servers probe keeps what strays needs ------------------------------------------

def test_an_ended_instances_memory_stays_while_its_server_lives(tmp_path) -> None:
    """A per-job instance gone (its job ended) long past the event window: its memory
    is kept for as long as one of its servers lives, with only the living ones."""
    import subprocess
    import time

    from mps_health.hostio.state import StateFile
    from mps_health.probes import proc
    from mps_health.probes.context import Context
    from mps_health.probes.servers import _collect

    cfg = from_mapping({"state_dir": str(tmp_path / "state")}, "site.yaml")
    (tmp_path / "state").mkdir()
    ctx = Context(cfg, "/", time.monotonic() + 30)
    living = subprocess.Popen(["sleep", "60"])
    try:
        ident = proc.identity("/proc", living.pid)
        assert ident is not None
        start = ident[1]
        old = 1000.0  # far past the window
        alive = RememberedServer(living.pid, start, "ACTIVE", old, "root", (), True)
        dead = RememberedServer(living.pid, start + 1, "ACTIVE", old, "root", (), True)
        state = StateFile(str(tmp_path / "state"), "servers")
        assert state.save({"job7": ServerMemory(old, 100, 1000, (alive, dead)),
                           "job8": ServerMemory(old, 101, 1000, (dead,))}) == ""
        facts = _collect(ctx, (), time.time(), {}, [])
        assert set(facts.previous) == {"job7", "job8"}
        kept, error = state.load(Dict[str, ServerMemory], {})
        assert error == "" and set(kept) == {"job7"}
        assert kept["job7"].servers == (alive,)
        assert remembered(kept) == {(living.pid, start)}
    finally:
        living.kill()
        living.wait()
    # Once it ends, the next run forgets it.
    _collect(ctx, (), time.time(), {}, [])
    after, _ = state.load(Dict[str, ServerMemory], {})
    assert after == {}


def test_planned_restarts_are_read_from_the_tree_under_root(tmp_path) -> None:
    """Under --root the servers probe reads the tree's planned.json, not the host's."""
    import time

    from mps_health.hostio.state import StateFile
    from mps_health.model.facts_deep import PlannedRestart
    from mps_health.probes.context import Context
    from mps_health.probes.servers import _collect

    state_dir = "/var/lib/mps-health-test-tree-only"
    inside = tmp_path / state_dir.lstrip("/")
    inside.mkdir(parents=True)
    record = PlannedRestart("/tmp/nvidia-mps", time.time(), 7, 70, "reset")
    assert StateFile(str(inside), "planned").save((record,)) == ""
    ctx = Context(from_mapping({"state_dir": state_dir}, "site.yaml"), str(tmp_path),
                  time.monotonic() + 30)
    facts = _collect(ctx, (), time.time(), {}, [])
    assert facts.planned == (record,)


# --- impostors, unexpected daemons, the OK case --------------------------------------

def test_processes_named_like_mps_running_another_binary_are_impostors() -> None:
    fakes = [server(600 + i, uid=EVIL, genuine=False) for i in range(7)]
    found = run_strays([*fakes, daemon(700)._replace(uid=EVIL, genuine=False)])
    assert codes(found) == [(WARNING, "mps-impostor")]
    assert "8 process(es) of uid 1001 named like an MPS daemon or server run another binary " \
        "than the configured one (pids 600, 601, 602, 603, 604 and 3 more) on " \
        f"{PIPE}: not counted as MPS" in found[0].message
    assert "ls -l /proc/600/exe" in found[0].action and "ask their owner" in found[0].action


def test_a_daemon_on_a_pipe_dir_no_instance_uses_is_unexpected() -> None:
    inst = Instance("node", "node", PIPE, "/var/log/nvidia-mps")
    facts = Facts("n1", 2000.0, "/", (inst,), {"processes": (daemon(100), daemon(200, "/srv/x")),
                                               "servers": servers_facts({})}, {}, {})
    found = list(strays.check(facts, from_mapping({}, "site.yaml")))
    assert codes(found) == [(WARNING, "daemon-unexpected")]
    assert found[0].message == "control daemon 200 (uid 0) serves /srv/x, which no " \
        "configured instance uses"
    assert "add it to the config's mps section" in found[0].action
    # Per-job daemons come and go with jobs: none is unexpected.
    per_job = from_mapping({"mps": {"layout": "per-job", "pipe_dir": "/tmp/mps_job{job}",
                                    "log_dir": "/tmp/log_job{job}"}}, "site.yaml")
    assert codes(strays.check(facts, per_job)) == [(OK, "ok")]


def test_nothing_outside_the_instances_is_ok() -> None:
    found = run_strays([])
    assert codes(found) == [(OK, "ok")]
    assert found[0].message == "no MPS process outside the configured instances"
