"""A local user holds the control daemon: the check names them, unblock frees it, and
nothing a user does this way drains the node or ends another user's work.

The fake daemon reads one connection at a time, as the real one does: a connection to
its 0666 control socket that sends nothing holds every query and client. Attacks run as
an unprivileged uid (tests/helpers/hostile.py).
"""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from clirun import check_mps, mps_health
from hostile import ATTACKER, VICTIM, as_user, ensure_user
from mpsdaemon import stop_process
from nodesite import Site
from paths import FAKE_SERVER

# A user's process holding an idle connection to the control socket: it connects,
# says it is ready, and then sends nothing until it is ended.
HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.send(sys.argv[2].encode())
print("held", flush=True)
time.sleep(3600)
"""


def check_json(config: str, *more: str) -> Tuple[int, dict]:
    r = mps_health("check", "--config", config, "--format", "json", *more)
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def problems(report: dict) -> dict:
    return {p["code"]: p for p in report["problems"]}


@pytest.fixture
def started() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait()


def hold(site: Site, started: List[subprocess.Popen], user: str = ATTACKER,
         half: str = "") -> subprocess.Popen:
    """A process of ``user`` that holds the daemon: connected, ``half`` a command sent."""
    p = subprocess.Popen(["python3", "-c", HOLDER, str(site.pipe / "control"), half],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, **as_user(user))
    started.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == b"held"
    return p


def config_for(site: Site, **more: object) -> str:
    # strays judges the whole node, where other test runs' fakes may be running; the
    # audit trail stays in the site (never the host's log, never syslog).
    return site.config({"control": {"timeout_s": 1.0}, "checks": {"disable": ["strays"]},
                        "remediation": {"audit_log": f"{site.root}/audit.log",
                                        "syslog": False}}, **more)


@pytest.mark.parametrize("half", ["", "get_server_li"])
def test_an_idle_connection_is_named_and_unblock_frees_it(site: Site, started, half) -> None:
    site.start_daemon()
    config = config_for(site)
    uid = ensure_user(ATTACKER).pw_uid
    holder = hold(site, started, half=half)
    rc, report = check_json(config)
    found = problems(report)
    assert rc == 2 and "blocked-connection" in found, report
    blocked = found["blocked-connection"]
    assert f"pid {holder.pid} (python3, user {ATTACKER}, uid {uid}" in blocked["message"]
    assert "sends no command" in blocked["message"]
    assert "mps-health remediate unblock node" in blocked["action"]
    assert "remediate reset" not in blocked["action"]
    # The wedge it causes is folded under it: one cause, one alert.
    assert "control-wedged" not in found, report
    view = mps_health("clients", "--config", config)
    assert f"HELD by pid {holder.pid} (python3, user {ATTACKER}" in view.stdout, view.stdout
    held = json.loads(mps_health("clients", "--config", config, "--format", "json").stdout)
    assert [(b["pid"], b["uid"], b["kind"]) for b in held["instances"][0]["held_by"]] == [
        (holder.pid, uid, "connection")]
    plan = mps_health("remediate", "unblock", "--config", config, "--dry-run")
    assert plan.returncode == 0 and f"end pid {holder.pid}" in plan.stdout, plan.stdout
    assert holder.poll() is None  # a dry run changes nothing
    done = mps_health("remediate", "unblock", "--config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the daemon answers again" in done.stdout
    assert holder.wait(5) is not None
    rc, report = check_json(config)
    assert rc == 0, report["problems"]
    audit = (site.root / "audit.log").read_text()
    assert "action=unblock event=unblock-end result=ok" in audit and f"pid={holder.pid}" in audit


def test_the_instance_s_own_stopped_server_is_continued_not_ended(site: Site) -> None:
    daemon = site.start_daemon()
    config = config_for(site)
    uid = ensure_user(VICTIM).pw_uid
    server = int(daemon.query(f"fake_client_connect {os.getpid()} {uid}").stdout.split()[0])
    deadline = time.monotonic() + 10
    while os.stat(f"/proc/{server}").st_uid != uid and time.monotonic() < deadline:
        time.sleep(0.02)  # it runs as its client's user once it has started
    stop_process(server)
    try:
        rc, report = check_json(config)
        found = problems(report)
        assert rc == 2 and "blocked-server" in found, report
        assert f"kill -CONT {server}" in found["blocked-server"]["action"]
        assert f"uid {uid}" in found["blocked-server"]["message"]
        done = mps_health("remediate", "unblock", "--config", config)
        assert done.returncode == 0 and f"continue pid {server}" in done.stdout, done.stdout
        assert "the daemon answers again" in done.stdout
        # Continued, not ended: the job's server (and its client) go on.
        assert daemon.query(f"get_server_status {server}").stdout.strip() == "ACTIVE"
    finally:
        os.kill(server, signal.SIGCONT)
    rc, report = check_json(config)
    assert rc == 0, report["problems"]


def test_a_user_s_stopped_server_binary_on_the_pipe_dir_is_named_and_ended(
        site: Site, started) -> None:
    site.start_daemon()
    config = config_for(site)
    uid = ensure_user(ATTACKER).pw_uid
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(site.pipe), "FAKE_MPS_SERVER_HOLD": "1"}
    server = subprocess.Popen([FAKE_SERVER, ""], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, **as_user(ATTACKER))
    started.append(server)
    assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
    stop_process(server.pid)
    rc, report = check_json(config)
    found = problems(report)
    assert rc == 2 and "blocked-foreign-server" in found, report
    assert f"pid {server.pid}" in found["blocked-foreign-server"]["message"]
    assert f"uid {uid}" in found["blocked-foreign-server"]["message"]
    assert "blocked-connection" not in found  # one blocker, one line
    done = mps_health("remediate", "unblock", "--config", config)
    assert done.returncode == 0 and "the daemon answers again" in done.stdout, done.stdout
    assert server.wait(5) is not None


def test_a_stopped_client_blocks_nothing(site: Site, started) -> None:
    daemon = site.start_daemon()
    config = config_for(site)
    uid = ensure_user(VICTIM).pw_uid
    client = subprocess.Popen(["sleep", "600"], **as_user(VICTIM))
    started.append(client)
    daemon.query(f"fake_client_connect {client.pid} {uid}")
    stop_process(client.pid)  # as scontrol suspend does to a job's tasks
    rc, report = check_json(config)
    assert rc == 0, report["problems"]


def test_a_stopped_daemon_is_continued(site: Site) -> None:
    daemon = site.start_daemon()
    config = config_for(site)
    daemon.signal(signal.SIGSTOP)
    try:
        rc, report = check_json(config)
        found = problems(report)
        assert rc == 2 and "daemon-stopped" in found, report
        assert f"kill -CONT {daemon.pid}" in found["daemon-stopped"]["action"]
        assert "control-wedged" not in found, report
        done = mps_health("remediate", "unblock", "--config", config)
        assert done.returncode == 0 and "the daemon answers again" in done.stdout, done.stdout
    finally:
        daemon.signal(signal.SIGCONT)


def test_reset_frees_the_blocker_first_and_restarts_nothing(site: Site, started) -> None:
    daemon = site.start_daemon()
    config = config_for(site)
    before = daemon.pid
    holder = hold(site, started)
    done = mps_health("remediate", "reset", "--config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"end pid {holder.pid}" in done.stdout and "is healthy: nothing to do" in done.stdout
    assert holder.wait(5) is not None
    assert os.path.exists(f"/proc/{before}")  # the daemon was never restarted


def test_the_health_check_frees_the_daemon_within_its_run_and_never_drains(
        site: Site, started) -> None:
    daemon = site.start_daemon()
    config = config_for(site)
    victim = ensure_user(VICTIM).pw_uid
    job = subprocess.Popen(["sleep", "600"], **as_user(VICTIM))
    started.append(job)
    server = int(daemon.query(f"fake_client_connect {job.pid} {victim}").stdout.split()[0])
    for _ in range(3):  # a user reconnects after each unblock
        holder = hold(site, started)
        plugin = check_mps("--config", config, "-t", "10")
        assert plugin.returncode == 2 and "blocked-connection" in plugin.stdout, plugin.stdout
        r = mps_health("healthcheck", "--config", config, "--dry-run")
        assert "blocked-connection" in r.stdout, r.stdout
        assert "would drain" not in r.stdout, r.stdout
        r = mps_health("healthcheck", "--config", config)
        assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: blocker-repeated, at last
        assert f"MPS-HC: unblocked node: ended pid {holder.pid}" in r.stdout, r.stdout
        assert "node not drained by us" in r.stdout and "would drain" not in r.stdout
        assert holder.wait(5) is not None
        # Another user's job is never ended: its client and its server go on.
        assert job.poll() is None and os.path.exists(f"/proc/{server}")
        assert daemon.query(f"get_server_status {server}").stdout.strip() == "ACTIVE"
    rc, report = check_json(config)
    assert "blocker-repeated" in problems(report), report
    assert rc == 1  # a WARNING naming the uid, nothing more
    assert f"user {ATTACKER}" in problems(report)["blocker-repeated"]["message"]


def test_with_unblock_off_the_health_check_names_the_blocker_and_does_not_drain(
        site: Site, started) -> None:
    site.start_daemon()
    config = config_for(site, healthcheck={"unblock": False, "boot_grace_s": 0})
    holder = hold(site, started)
    for _ in range(3):
        r = mps_health("healthcheck", "--config", config, "--dry-run")
        assert f"pid {holder.pid}" in r.stdout and "would drain" not in r.stdout, r.stdout
    assert holder.poll() is None


def test_sock_diag_is_what_names_the_peer() -> None:
    from mps_health.hostio import unixdiag

    path = Path(f"/tmp/mpsh-diag-{os.getpid()}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(str(path))
        listener.listen(2)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.connect(str(path))
        accepted, _ = listener.accept()
        try:
            found = unixdiag.connected([str(path)], 2.0)
        except OSError as e:
            pytest.skip(f"this kernel refuses sock_diag: {e}")
        assert [(s.inode, s.peer) for s in found] == [
            (os.fstat(accepted.fileno()).st_ino, os.fstat(client.fileno()).st_ino)]
        held, whole = unixdiag.holders("/proc", [found[0].peer], time.monotonic() + 5)
        assert whole and held == {found[0].peer: [os.getpid()]}
        client.close()
        accepted.close()
    finally:
        listener.close()
        path.unlink()


def test_two_held_instances_are_each_named_and_freed_in_one_run(site: Site, started) -> None:
    for g in ("0", "1"):
        site.start_daemon(f"gpu{g}")
    config = site.config({"control": {"timeout_s": 1.0}, "checks": {"disable": ["strays"]},
                          "remediation": {"audit_log": f"{site.root}/audit.log",
                                          "syslog": False}},
                         mps={"layout": "per-gpu", "gpus": [0, 1]},
                         pipe=f"{site.root}/gpu{{gpu}}-pipe", log=f"{site.root}/gpu{{gpu}}-log")
    holders = {}
    for g in ("0", "1"):
        p = subprocess.Popen(["python3", "-c", HOLDER, str(site.root / f"gpu{g}-pipe" / "control"),
                              ""], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             **as_user(ATTACKER))
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == b"held"
        holders[f"gpu{g}"] = p
    rc, report = check_json(config)
    named = {p["instance"]: p["message"] for p in report["problems"]
             if p["code"] == "blocked-connection"}
    assert rc == 2 and set(named) == {"gpu0", "gpu1"}, report["problems"]
    for name, p in holders.items():  # each instance names its own holder, not the other's
        assert f"pid {p.pid} " in named[name]
        other = holders["gpu1" if name == "gpu0" else "gpu0"]
        assert f"pid {other.pid} " not in named[name]
    done = mps_health("remediate", "unblock", "--config", config)
    assert done.returncode == 0 and done.stdout.count("the daemon answers again") == 2, \
        done.stdout
    assert check_json(config)[0] == 0
