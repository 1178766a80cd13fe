"""A user runs the genuine server binary and keeps it from running, as an unprivileged uid.

``nvidia-cuda-mps-server`` is world-executable, so ``/proc/PID/exe`` of a user's process
can be the configured binary: held at its exec under ptrace (tests/fakes/held.c: none of
its code runs), or started and left alone, with a pipe dir of the user's choice. Neither
was ever a daemon's server, so neither is ``server-orphaned`` CRITICAL (a drain): at most
the WARNING ``server-unclaimed``, one line naming the uid. A real daemon's server, seen
by one run and left behind when its daemon dies, still is CRITICAL.
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from clirun import mps_health
from hostile import ATTACKER, Held, as_user, ensure_user
from mpsdaemon import stop_process
from nodesite import Site
from paths import FAKE_SERVER

# strays judges every process on the machine: in its own PID namespace, the test sees
# only the servers it started, not other test runs' (tests/helpers/privatepids.py).
pytestmark = pytest.mark.private_pids


def check_json(config: str, only: str = "strays") -> Tuple[int, dict]:
    r = mps_health("check", "--config", config, "--only", only, "--format", "json")
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def problems(report: dict) -> dict:
    return {(p["instance"], p["code"]): p for p in report["problems"]}


@pytest.fixture
def started() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_held_or_idle_genuine_server_of_a_user_is_one_warning(site: Site, started) -> None:
    site.start_daemon()  # the instance is served: only the user's servers are strays
    config = site.config()
    uid = ensure_user(ATTACKER).pw_uid
    theirs = site.root / "evil-pipe"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(theirs)}
    # One left running, never a daemon's child (as one paused by an LD_PRELOAD
    # constructor: its binary is the genuine one, and it never serves).
    idle = subprocess.Popen([FAKE_SERVER], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, **as_user(ATTACKER))
    started.append(idle)
    assert idle.stdout is not None and idle.stdout.readline().strip() == b"ready"
    with Held(ATTACKER, [FAKE_SERVER, ""], env) as held, \
            Held(ATTACKER, [FAKE_SERVER, ""], env) as second:
        assert os.readlink(f"/proc/{held.pid}/exe") == os.path.realpath(FAKE_SERVER)
        rc, report = check_json(config)
    found = problems(report)
    assert rc == 1, report  # a WARNING: never CRITICAL, so never a drain
    assert all(p["state"] != "CRITICAL" for p in report["problems"]), report
    assert ("", "server-orphaned") not in found
    unclaimed = [p for p in report["problems"] if p["code"] == "server-unclaimed"]
    assert len(unclaimed) == 1, unclaimed  # one line for the uid, not one per process
    text = unclaimed[0]["message"]
    assert unclaimed[0]["state"] == "WARNING" and f"uid {uid}" in text
    assert "3 nvidia-cuda-mps-server process(es)" in text
    for pid in (idle.pid, held.pid, second.pid):
        assert str(pid) in text
    assert str(theirs) in text and "2 of them traced or stopped" in text
    assert f"ls -l /proc/{min(idle.pid, held.pid, second.pid)}/exe" in unclaimed[0]["action"]
    assert "reset" not in unclaimed[0]["action"].replace("do not reset", "")


def test_a_held_server_on_the_instance_dir_without_its_daemon_is_no_critical(
        site: Site) -> None:
    """The user's held server on the instance's own pipe dir, its daemon gone: the
    missing daemon is the daemon check's finding; strays stays a WARNING."""
    pipe, _ = site.dirs()
    config = site.config()
    uid = ensure_user(ATTACKER).pw_uid
    with Held(ATTACKER, [FAKE_SERVER, ""], {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}) as held:
        rc, report = check_json(config)
    assert rc == 1, report
    [unclaimed] = [p for p in report["problems"] if p["code"] == "server-unclaimed"]
    assert f"uid {uid}" in unclaimed["message"] and str(held.pid) in unclaimed["message"]
    assert ("", "server-orphaned") not in problems(report)


def test_a_daemons_server_left_behind_is_still_critical(site: Site) -> None:
    daemon = site.start_daemon(FAKE_MPS_SERVER_OUTLIVES="1")
    config = site.config()
    server = int(daemon.query("fake_server_start").stdout)
    rc, report = check_json(config)  # the servers probe remembers the daemon's server
    assert (rc, report["problems"]) == (0, []), report
    memory = (site.state_dir / "servers.json").read_text()
    assert str(server) in memory
    daemon.stop()
    time.sleep(0.3)
    assert Path(f"/proc/{server}").exists()  # it outlived its daemon
    for _ in range(2):  # and it stays known while it lives
        rc, report = check_json(config)
        orphaned = problems(report)[("", "server-orphaned")]
        assert rc == 2 and orphaned["state"] == "CRITICAL", report
        assert f"nvidia-cuda-mps-server {server} " in orphaned["message"]
        assert ("", "server-unclaimed") not in problems(report)
    # Stopped, it proves nothing any more (anyone can stop their own server): a WARNING.
    stop_process(server)
    try:
        rc, report = check_json(config)
    finally:
        os.kill(server, signal.SIGCONT)
    assert rc == 1, report
    assert ("", "server-orphaned") not in problems(report)
    assert "1 of them traced or stopped" in problems(report)[("", "server-unclaimed")]["message"]
    os.kill(server, signal.SIGKILL)


def test_a_users_own_daemon_on_the_shared_dir_vouches_for_nothing(site: Site) -> None:
    """The node's daemon is down; a user starts the genuine control binary on the 0777
    pipe dir (its pid file, its socket), lets it start a server and kills the daemon:
    the server was a daemon's child, but not of the daemon the config expects (root),
    so it is no server-orphaned."""
    import mpsdaemon

    pipe, _ = site.dirs()
    log = site.root / "evil-log"
    log.mkdir(mode=0o777)
    log.chmod(0o777)
    config = site.config()
    uid = ensure_user(ATTACKER).pw_uid
    theirs = mpsdaemon.start_daemon(pipe, log, env={"FAKE_MPS_SERVER_OUTLIVES": "1"},
                                    cwd="/", **as_user(ATTACKER))
    server = int(mpsdaemon.query(pipe, "fake_server_start").stdout)
    try:
        check_json(config)  # its server is listed, and its daemon's child
        mpsdaemon.kill_daemon(theirs)
        time.sleep(0.3)
        assert Path(f"/proc/{server}").exists()
        rc, report = check_json(config)
        assert rc == 1, report
        assert ("", "server-orphaned") not in problems(report)
        unclaimed = problems(report)[("", "server-unclaimed")]
        assert f"uid {uid}" in unclaimed["message"] and str(server) in unclaimed["message"]
    finally:
        mpsdaemon.kill_daemon(theirs)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_a_users_stopped_server_on_the_live_daemons_dir_is_named(site: Site,
                                                                 started) -> None:
    """The user's way to hang a node's MPS: the genuine server binary run on the live
    instance's pipe dir and stopped. One WARNING naming the uid and the pid, with the
    command that ends it: never a reset, never a drain. Running, it is left as before."""
    site.start_daemon()
    config = site.config()
    uid = ensure_user(ATTACKER).pw_uid
    theirs = subprocess.Popen([FAKE_SERVER], env={"CUDA_MPS_PIPE_DIRECTORY": str(site.pipe)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              **as_user(ATTACKER))
    started.append(theirs)
    assert theirs.stdout is not None and theirs.stdout.readline().strip() == b"ready"
    _rc, report = check_json(config)
    assert ("", "server-stopped-foreign") not in problems(report), report
    stop_process(theirs.pid)
    try:
        rc, report = check_json(config)
    finally:
        os.kill(theirs.pid, signal.SIGCONT)
    assert rc == 1, report
    found = problems(report)[("", "server-stopped-foreign")]
    assert found["state"] == "WARNING"
    assert f"of uid {uid} on {site.pipe}" in found["message"]
    assert f"(pids {theirs.pid})" in found["message"]
    assert "mps-health remediate unblock" in found["action"]
    assert f"ps -o pid,user,lstart,stat,args -p {theirs.pid}" in found["action"]
    assert "remediate reset" not in found["action"]
