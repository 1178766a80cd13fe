"""servers: parse the real answers; FAULT, stuck INITIALIZING, churn and restarts end to end."""

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from clirun import mps_health, results
from conftest import fixture_text
from mps_health.model.facts_deep import ClientFact, InstanceServers, ServerFact
from mps_health.probes import clientinfo
from mps_health.probes import server_queries as probe
from mps_health.probes.servers import parse_children
from mps_health.probes.servertrack import advance


@pytest.fixture
def sleepers() -> Iterator[List[subprocess.Popen]]:
    """Stand-ins for CUDA clients: real processes, killed by PID afterwards."""
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def sleeper(started: List[subprocess.Popen]) -> int:
    p = subprocess.Popen(["sleep", "120"])
    started.append(p)
    return p.pid


# --- parse, on the real answers -------------------------------------------------------

def test_parse_real_answers() -> None:
    assert probe.parse_server_status(fixture_text(
        "nvidia-cuda-mps-control_get_server_status__h200-cuda13.0_active.txt")) == "ACTIVE"
    assert probe.parse_server_status(fixture_text(
        "nvidia-cuda-mps-control_get_server_status__h200-cuda13.0_unknown-pid.txt")) == "gone"
    assert probe.parse_pid_list(fixture_text(
        "nvidia-cuda-mps-control_get_server_list__h200-cuda13.0_idle.txt")) == ()
    assert probe.parse_pid_list("510\n4242\n") == (510, 4242)
    assert parse_children("31408 31410 ") == (31408, 31410)


def test_parse_rejects_what_is_not_an_answer() -> None:
    with pytest.raises(clientinfo.ParseError, match="unexpected status 'Unknown command"):
        probe.parse_server_status('Unknown command "get_server_status"\n')
    with pytest.raises(clientinfo.ParseError, match="one PID a line"):
        probe.parse_pid_list(fixture_text(
            "nvidia-cuda-mps-control_get_client_list__h200-cuda13.0_unknown-pid.txt"))


# --- history (pure) ---------------------------------------------------------------------

def _servers(*servers: ServerFact, daemon: int = 100) -> InstanceServers:
    return InstanceServers("ok", "", daemon, 5, tuple(servers), 0.01)


def _server(pid: int, status: str = "ACTIVE", clients: tuple = ()) -> ServerFact:
    return ServerFact(pid, status, "", 0, "root", pid * 10,
                      tuple(ClientFact(c, 1000, "alice", c * 10) for c in clients))


def test_status_since_survives_runs_and_resets_on_change() -> None:
    m1 = advance(None, _servers(_server(7, "INITIALIZING")), (), 1000.0, 3600)
    m2 = advance(m1, _servers(_server(7, "INITIALIZING")), (), 1100.0, 3600)
    assert m2.servers[0].status_since == 1000.0
    m3 = advance(m2, _servers(_server(7, "ACTIVE")), (), 1200.0, 3600)
    assert m3.servers[0].status_since == 1200.0


def test_churn_only_when_clients_outlive_their_server() -> None:
    m1 = advance(None, _servers(_server(7, clients=(40, 41))), (), 1000.0, 3600)
    ended = advance(m1, _servers(), (), 1100.0, 3600)  # the job ended with its server
    assert ended.events == ()
    churn = advance(m1, _servers(_server(8)), ((41, 410),), 1100.0, 3600)
    assert [e.code for e in churn.events] == ["server-churn"]
    assert "server 7 (root) went away while its clients 41 still run" in churn.events[0].message
    later = advance(churn, _servers(_server(8)), (), 1100.0 + 3601, 3600)
    assert later.events == ()  # out of the window


def test_daemon_restart_is_an_event_and_failed_queries_invent_none() -> None:
    m1 = advance(None, _servers(daemon=100), (), 1000.0, 3600)
    failed = advance(m1, InstanceServers("timeout", "", 101, 6, (), 2.0), (), 1100.0, 3600)
    assert failed.events == () and failed.daemon_pid == 100
    m2 = advance(m1, _servers(daemon=101), (), 1100.0, 3600)
    assert [e.code for e in m2.events] == ["daemon-restarted"]


# --- end to end against the fake daemon ------------------------------------------------

def test_idle_daemon_is_not_asked(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    r = mps_health("check", "--config", cfg, "--only", "servers", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = results(r, "servers")
    assert res["message"] == "no server running" and res["values"]["servers"] == 0
    # No server process: two small /proc reads, no client run (the fast tier's cost).
    assert "get_server_list" not in (d.log_dir / "control.log").read_text()


def test_fault_server_is_critical_with_pid_user_and_clients(site,
                                                            sleepers) -> None:
    d = site.start_daemon()
    cfg = site.config()
    client = sleeper(sleepers)
    server = int(d.query(f"fake_client_connect {client}").stdout)
    d.query(f"fake_server_set {server} FAULT")
    r = mps_health("check", "--config", cfg, "--only", "servers")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"CRITICAL servers[node] server-fault: server {server} (root) with clients {client} "
            "(root) is in FAULT") in r.stdout
    assert "mps-health remediate reset node" in r.stdout
    r = mps_health("check", "--config", cfg, "--only", "servers", "--format", "json")
    (res,) = results(r, "servers")
    assert res["values"] == {"servers": 1, "clients": 1, "servers_fault": 1,
                             "servers_initializing": 0}


def test_initializing_is_stuck_only_across_runs(site) -> None:
    d = site.start_daemon()
    cfg = site.config("servers:\n  init_stuck_s: 1\n")
    server = int(d.query("fake_server_start INITIALIZING").stdout)
    first = mps_health("check", "--config", cfg, "--only", "servers")
    assert first.returncode == 0, first.stdout + first.stderr
    time.sleep(1.2)
    second = mps_health("check", "--config", cfg, "--only", "servers")
    assert second.returncode == 2
    assert f"server-stuck-initializing: server {server} (root) with no client has been " \
           "INITIALIZING for " in second.stdout
    assert "(limit 1s): its clients wait forever" in second.stdout


def test_server_gone_under_live_clients_is_churn(site,
                                                 sleepers) -> None:
    d = site.start_daemon()
    cfg = site.config()
    client = sleeper(sleepers)
    server = int(d.query(f"fake_client_connect {client}").stdout)
    assert mps_health("check", "--config", cfg, "--only", "servers").returncode == 0
    d.query(f"fake_server_stop {server} 1")
    r = mps_health("check", "--config", cfg, "--only", "servers")
    assert r.returncode == 1
    assert (f"server-churn: server {server} (root) went away while its clients {client} "
            "still run (no job ended)") in r.stdout
    again = mps_health("check", "--config", cfg, "--only", "servers")
    # one event, kept: in the summary and one line
    assert again.stdout.startswith("MPS WARNING - 1 problem: server-churn node\n"), again.stdout
    assert again.stdout.count("WARNING servers[node] server-churn:") == 1, again.stdout


def test_ended_job_is_not_churn(site, sleepers) -> None:
    d = site.start_daemon()
    cfg = site.config()
    client = sleeper(sleepers)
    server = int(d.query(f"fake_client_connect {client}").stdout)
    assert mps_health("check", "--config", cfg, "--only", "servers").returncode == 0
    sleepers[0].kill()
    sleepers[0].wait()
    d.query(f"fake_server_stop {server}")
    r = mps_health("check", "--config", cfg, "--only", "servers")
    assert r.returncode == 0, r.stdout


def test_daemon_restart_is_reported(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    old = d.pid
    assert mps_health("check", "--config", cfg, "--only", "servers").returncode == 0
    d.query("quit")
    d.start()
    r = mps_health("check", "--config", cfg, "--only", "servers")
    assert r.returncode == 1
    assert f"daemon-restarted: the control daemon changed since the last run (was {old}, " \
           f"now {d.pid})" in r.stdout


def test_stopped_daemon_with_a_server_is_bounded(site) -> None:
    d = site.start_daemon()
    cfg = site.config("control:\n  timeout_s: 0.5\n")
    d.query("fake_server_start")
    d.signal(signal.SIGSTOP)
    try:
        r = mps_health("check", "--config", cfg, "--only", "servers", "--format", "json")
    finally:
        d.signal(signal.SIGCONT)
    (res,) = results(r, "servers")
    assert r.returncode == 3 and res["code"] == "servers-not-asked"
    assert res["message"].startswith("cannot list the servers (timeout: no answer within")
    assert json.loads(r.stdout)["gather_s"]["servers"] < 5


def test_replay_judges_the_saved_memory_and_writes_nothing(tmp_path: Path, site) -> None:
    d = site.start_daemon()
    cfg = site.config("servers:\n  init_stuck_s: 1\n")
    d.query("fake_server_start INITIALIZING")
    mps_health("check", "--config", cfg, "--only", "servers")
    time.sleep(1.1)
    snap = tmp_path / "snap.json"
    assert mps_health("snapshot", "--config", cfg, "-o", str(snap)).returncode == 0
    state = site.state_dir / "servers.json"
    before = state.read_bytes()
    r = mps_health("check", "--replay", str(snap), "--only", "servers")
    assert r.returncode == 2 and "server-stuck-initializing" in r.stdout
    assert state.read_bytes() == before


def test_bad_section_is_one_line(site) -> None:
    site.start_daemon()
    cfg = site.config("servers:\n  init_stuck_s: soon\n")
    r = mps_health("check", "--config", cfg, "--only", "servers")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == f"mps-health: {cfg}: key 'servers.init_stuck_s': must be a number >= 0 " \
           "(got 'soon')\n"
