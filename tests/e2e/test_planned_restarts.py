"""Restarts mps-health makes itself are planned: no daemon-restarted warning for them,
while an unplanned restart still warns, once per instance and code however often. Servers
our own action ended are no server-churn, and a reset answers the events before it."""

import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest
from clirun import mps_health
from mps_health.hostio import planned
from mps_health.model.facts_deep import (
    Ack,
    ClientFact,
    InstanceServers,
    PlannedRestart,
    ServerEvent,
    ServerFact,
    ServerMemory,
)
from mps_health.probes.jobphase import TEARDOWN
from mps_health.probes.servertrack import MAX_EVENTS, advance
from mpsdaemon import query, start_daemon
from remhelp import daemons_of, kill_and_wait, make_dirs, remediating  # noqa: F401


def servers(pid: int, start: int = 5) -> InstanceServers:
    return InstanceServers("idle", "", pid, start, (), 0.0)


def test_a_recorded_restart_is_no_event_and_another_daemon_is() -> None:
    m1 = advance(None, servers(100), (), 1000.0, 3600)
    mine = (PlannedRestart("/p", 1050.0, 101, 5, "reset"),)
    assert advance(m1, servers(101), (), 1100.0, 3600, mine, "/p").events == ()
    # another daemon than the one we started, another pipe dir, or a record from before
    # the previous run: not excused
    assert advance(m1, servers(102), (), 1100.0, 3600, mine, "/p").events != ()
    assert advance(m1, servers(101), (), 1100.0, 3600, mine, "/q").events != ()
    old = (PlannedRestart("/p", 900.0, None, None, "unit stop"),)
    assert advance(m1, servers(101), (), 1100.0, 3600, old, "/p").events != ()
    # a unit start names no daemon: any change in that interval is ours
    unit = (PlannedRestart("/p", 1010.0, None, None, "unit start"),)
    assert advance(m1, servers(103), (), 1100.0, 3600, unit, "/p").events == ()


def test_records_are_bounded_and_dated(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    for i in range(planned.MAX_RECORDS + 10):
        assert planned.record(state, f"/p{i}", "unit stop", i, i) == ""
    records, error = planned.load(state)
    assert error == "" and len(records) == planned.MAX_RECORDS
    assert records[-1].pipe_dir == f"/p{planned.MAX_RECORDS + 9}"
    # Each instance's newest reset outlives the rest (the reset cooldown reads it), at
    # most MAX_KEPT_RESETS of them beyond MAX_RECORDS.
    for i in range(planned.MAX_RECORDS + planned.MAX_KEPT_RESETS + 10):
        assert planned.record(state, f"/r{i}", "reset", i, i) == ""
    records, error = planned.load(state)
    assert error == "" and len(records) == planned.MAX_RECORDS + planned.MAX_KEPT_RESETS
    assert planned.keep([PlannedRestart("/x", float("nan")),
                         PlannedRestart("/x", 1e308)], 1000.0) == ()


def test_a_read_only_state_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    why = planned.record(str(tmp_path / "file" / "state"), "/p", "reset")
    assert why.startswith("planned restart not recorded: cannot use state dir ")


def test_events_are_bounded_per_instance() -> None:
    m = ServerMemory(0.0, 1, 1, (), tuple(ServerEvent(float(i), "daemon-restarted", "x")
                                          for i in range(500)))
    assert len(advance(m, servers(2, 2), (), 600.0, 3600).events) == MAX_EVENTS


def test_reset_then_check_is_ok_but_an_unplanned_restart_warns_once(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    start_daemon(site.pipe, site.log)

    def check() -> str:
        r = mps_health("check", "--config", cfg, "--only", "servers")
        assert r.returncode in (0, 1), r.stdout + r.stderr
        return r.stdout

    check()  # remembers the daemon
    r = mps_health("remediate", "reset", "--config", cfg, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "daemon-restarted" not in check()  # our own restart: no alarm
    for _ in range(3):  # three unplanned restarts: one finding with a count
        for pid in daemons_of(site.pipe):
            kill_and_wait(pid)
        start_daemon(site.pipe, site.log)
        out = check()
    lines = [ln for ln in out.splitlines() if "daemon-restarted" in ln]
    assert len(lines) == 2, out  # the summary and one finding
    assert "daemon-restarted: 3 times, first " in out and "the last: the control daemon " \
        "changed since the last run" in out, out


# --- servers our own action ended; events a reset answered ------------------------------

def _with_server(pid: int, clients: tuple = (), daemon: int = 100) -> InstanceServers:
    server = ServerFact(pid, "ACTIVE", "", 0, "root", pid * 10,
                        tuple(ClientFact(c, 0, "root", c * 10) for c in clients))
    return InstanceServers("ok", "", daemon, 5, (server,), 0.01)


def test_servers_lost_while_our_action_ended_their_daemon_are_no_churn() -> None:
    m1 = advance(None, _with_server(7, (40,)), (), 1000.0, 3600, (), "/p")
    client_alive = ((40, 400),)
    after = servers(101)._replace(query="ok")
    for by in ("reset begin", "reset", "unit stop", *TEARDOWN):
        ours = (PlannedRestart("/p", 1050.0, 101, 5, by),)
        assert advance(m1, after, client_alive, 1100.0, 3600, ours, "/p").events == (), by
    # starting a daemon ends no server; nor does an action on another dir, or one before
    # the run that saw the server
    for record in (PlannedRestart("/p", 1050.0, 101, 5, "unit start"),
                   PlannedRestart("/q", 1050.0, 101, 5, "reset"),
                   PlannedRestart("/p", 900.0, 101, 5, "reset")):
        codes = [e.code for e in advance(m1, after, client_alive, 1100.0, 3600, (record,),
                                         "/p").events]
        assert "server-churn" in codes, record


def test_a_reset_answers_the_events_before_it_and_not_those_after() -> None:
    before = ServerEvent(1000.0, "server-churn", "server 7 went away")
    m = ServerMemory(1000.0, 100, 5, (), (before,))
    reset = (PlannedRestart("/p", 1050.0, 101, 5, "reset"),)
    assert advance(m, servers(101), (), 1100.0, 3600, reset, "/p").events == ()
    # an event after the reset stays for the window; another dir's reset answers nothing
    later = ServerEvent(1060.0, "server-churn", "server 8 went away")
    m2 = m._replace(taken_at=1060.0, daemon_pid=101, events=(before, later))
    assert advance(m2, servers(101), (), 1100.0, 3600, reset, "/p").events == (later,)
    assert advance(m, servers(100), (), 1100.0, 3600, reset, "/q").events == (before,)
    # a unit stop or a Slurm hook is no repair: the events stay
    stop = (PlannedRestart("/p", 1050.0, None, None, "unit stop"),)
    assert advance(m, servers(100), (), 1100.0, 3600, stop, "/p").events == (before,)


def test_the_records_that_end_servers_name_the_hooks_tear_down() -> None:
    assert set(TEARDOWN) <= set(planned.ENDS_SERVERS) and planned.REPAIR in planned.ENDS_SERVERS


@pytest.fixture
def sleepers() -> Iterator[List[subprocess.Popen]]:
    """Stand-ins for CUDA clients: real processes, killed by PID afterwards."""
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _sleeper(started: List[subprocess.Popen]) -> int:
    p = subprocess.Popen(["sleep", "300"])
    started.append(p)
    return p.pid


@pytest.mark.parametrize("outlives", [False, True], ids=["server-dies", "server-outlives"])
def test_a_reset_after_a_fault_leaves_no_churn_but_a_new_churn_warns(site, sleepers,
                                                                     outlives) -> None:
    """The fault: the daemon killed under a server with a client. Its server dies with it
    (the reset finds none) or outlives it (the reset ends it by PID, --force: clients
    cannot be ruled out). Either way what was lost is the fault's and the reset's: after a
    successful reset the servers check is OK; a server lost after it still warns."""
    d = site.start_daemon(**({"FAKE_MPS_SERVER_OUTLIVES": "1"} if outlives else {}))
    cfg = site.config(remediating(site))

    def check(code: int = 0) -> str:
        r = mps_health("check", "--config", cfg, "--only", "servers")
        assert r.returncode == code, r.stdout + r.stderr
        return r.stdout

    client = _sleeper(sleepers)
    lost = int(d.query(f"fake_client_connect {client}").stdout)
    check()  # remembers the server and its client
    d.stop()  # the fault
    r = mps_health("remediate", "reset", "--config", cfg, *(["--force"] if outlives else []))
    assert r.returncode == 0, r.stdout + r.stderr
    out = check()
    assert "server-churn" not in out and "daemon-restarted" not in out, out
    assert str(lost) not in out
    # a new server lost under its live client after the repair is reported
    other = _sleeper(sleepers)
    server = int(query(site.pipe, f"fake_client_connect {other}").stdout)
    check()
    query(site.pipe, f"fake_server_stop {server} 1")
    out = check(1)
    assert (f"server-churn: server {server} (root) went away while its clients {other} "
            "still run (no job ended)") in out, out


# --- an operator's ack ------------------------------------------------------------------

def test_an_ack_drops_the_events_of_its_code_up_to_it() -> None:
    churn = ServerEvent(1000.0, "server-churn", "server 7 went away")
    restart = ServerEvent(1000.0, "daemon-restarted", "the control daemon changed")
    m = ServerMemory(1000.0, 100, 5, (), (churn, restart))
    ack = (Ack("server-churn", "gpu0", 1050.0),)
    kept = advance(m, servers(100), (), 1100.0, 3600, (), "/p", acks=ack, instance="gpu0")
    assert kept.events == (restart,)  # only the code acknowledged
    # another instance's ack acknowledges nothing here; an ack for every instance does
    assert advance(m, servers(100), (), 1100.0, 3600, (), "/p", acks=ack,
                   instance="gpu1").events == (churn, restart)
    every = (Ack("daemon-restarted", "", 1050.0),)
    assert advance(m, servers(100), (), 1100.0, 3600, (), "/p", acks=every,
                   instance="gpu1").events == (churn,)
    # an event after the ack is reported
    later = ServerEvent(1060.0, "server-churn", "server 8 went away")
    m2 = m._replace(events=(churn, later))
    assert advance(m2, servers(100), (), 1100.0, 3600, (), "/p", acks=ack,
                   instance="gpu0").events == (later,)


def test_acks_are_bounded_and_dated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    for _ in range(planned.MAX_ACKS + 5):
        assert planned.acknowledge(str(state), "server-churn", "node") == ""
    acks, error = planned.load_acks(str(state))
    assert error == "" and len(acks) == planned.MAX_ACKS
    assert planned.keep_acks([Ack("server-churn", "", float("nan")),
                              Ack("server-churn", "", 1e308)], 1000.0) == ()
    (tmp_path / "file").write_text("")
    why = planned.acknowledge(str(tmp_path / "file" / "state"), "server-churn")
    assert why.startswith("not acknowledged: ") and "\n" not in why, why


def test_ack_clears_a_churn_until_a_new_one(site, sleepers) -> None:
    d = site.start_daemon()
    cfg = site.config()

    def check(code: int) -> str:
        r = mps_health("check", "--config", cfg, "--only", "servers")
        assert r.returncode == code, r.stdout + r.stderr
        return r.stdout

    def churn() -> int:
        client = _sleeper(sleepers)
        server = int(d.query(f"fake_client_connect {client}").stdout)
        check(0)
        d.query(f"fake_server_stop {server} 1")
        return server

    first = churn()
    assert f"server-churn: server {first} " in check(1)
    r = mps_health("ack", "server-churn", "node", "--config", cfg)
    assert r.returncode == 0 and r.stdout == (
        "server-churn on node acknowledged: events up to now are no longer reported; the "
        "next one is\n"), r.stdout + r.stderr
    assert "server-churn" not in check(0)
    second = churn()
    out = check(1)
    assert f"server-churn: server {second} " in out and str(first) not in out, out
    # only the event codes, and one clear line
    bad = mps_health("ack", "daemon-stale", "--config", cfg)
    assert bad.returncode == 3 and "invalid choice" in bad.stderr and \
        "Traceback" not in bad.stderr, bad.stderr
