"""Advice an operator can paste at 3 a.m.: for each fault, every command the check's
action lines quote is run exactly as printed (split as a shell would, never a shell),
and the node is healthy afterwards. Where the fault leaves the daemon working (a dir's
mode or owner, a missing log dir, an event to acknowledge), the daemon, its server and
the connected client are still there afterwards.

On private trees with the fake daemon and a stand-in client (a real process the fake
daemon serves); the check is run with ``--config``, so each pasted command must carry
it to act on the same instance."""

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest
from clirun import mps_health
from mps_health.model.actionhints import commands
from mpsdaemon import stop_process
from nodesite import Daemon, Site
from remhelp import alive, daemons_of, remediating

CHECKS = "daemon,control,directories,servers"


def node_problems(cfg: str) -> List[dict]:
    """Our instance's problems (other runs' daemons on this machine are node-wide
    findings, not ours)."""
    r = mps_health("check", "--config", cfg, "--only", CHECKS, "--format", "json")
    assert r.returncode in (0, 1, 2, 3), r.stdout + r.stderr
    return [p for p in json.loads(r.stdout)["problems"] if p["instance"] == "node"]


def paste_all(cfg: str) -> List[str]:
    """Run every command the problems' actions quote, as printed; their codes."""
    problems = node_problems(cfg)
    assert problems, "the fault was not seen"
    seen = []
    for p in problems:
        for line in commands(p["action"]):
            words = shlex.split(line)
            assert words[0] == "mps-health" and "--config" in words, (p["code"], line)
            assert words[words.index("--config") + 1] == cfg, line
            if "--dry-run" in words:
                continue  # the advice says: dry run first; the real run follows it
            r = mps_health(*words[1:])
            assert r.returncode == 0, (p["code"], line, r.stdout + r.stderr)
        seen.append(p["code"])
    return seen


@pytest.fixture
def served(site: Site) -> Iterator[Tuple[Daemon, int, subprocess.Popen, str]]:
    """A daemon with a server and a connected client: (daemon, server, client, config)."""
    d = site.start_daemon()
    client = subprocess.Popen(["sleep", "300"])
    server = int(d.query(f"fake_client_connect {client.pid}").stdout)
    cfg = site.config(remediating(site))
    try:
        yield d, server, client, cfg
    finally:
        client.kill()
        client.wait()


def _pipe_mode(site: Site, d: Daemon) -> None:
    site.pipe.chmod(0o700)


def _log_mode(site: Site, d: Daemon) -> None:
    site.log.chmod(0o777)


def _log_gone(site: Site, d: Daemon) -> None:
    for entry in site.log.iterdir():
        entry.unlink()
    site.log.rmdir()


KEEPS_DAEMON: List[Tuple[str, Callable[[Site, Daemon], None], str]] = [
    ("pipe dir 0700", _pipe_mode, "pipe-dir-mode"),
    ("log dir 0777", _log_mode, "log-dir-mode"),
    ("log dir removed", _log_gone, "log-dir-missing"),
]


@pytest.mark.parametrize("label, fault, code", KEEPS_DAEMON, ids=[k[0] for k in KEEPS_DAEMON])
def test_a_dir_fault_pasted_leaves_the_daemon_and_its_client(site: Site, served, label: str,
                                                             fault, code: str) -> None:
    d, server, client, cfg = served
    fault(site, d)
    assert code in paste_all(cfg)
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe) == [d.pid]  # the same daemon: nothing was restarted
    assert alive(server) and client.poll() is None


def test_a_stopped_daemon_pasted_is_healthy_again(site: Site) -> None:
    d = site.start_daemon()
    cfg = site.config(remediating(site))
    stop_process(d.pid)
    try:
        codes = paste_all(cfg)
    finally:
        if alive(d.pid):
            os.kill(d.pid, signal.SIGCONT)
    assert "daemon-stopped" in codes
    # Healthy: the pasted 'kill -CONT' continued the same daemon (its jobs go on).
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe) == [d.pid]


def test_a_dead_daemon_pasted_is_healthy_again(site: Site) -> None:
    d = site.start_daemon()
    cfg = site.config(remediating(site))
    os.kill(d.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(d.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    codes = paste_all(cfg)
    assert {"daemon-stale", "daemon-absent"} & set(codes), codes
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe)


def test_an_event_pasted_is_acknowledged_until_the_next(site: Site, served) -> None:
    """A server lost under its client: the action names the ack that clears it."""
    d, server, client, cfg = served
    assert node_problems(cfg) == []  # the servers check remembers the server
    d.query(f"fake_server_stop {server} 1")
    time.sleep(0.2)
    codes = paste_all(cfg)
    assert codes == ["server-churn"], codes
    assert node_problems(cfg) == []
    assert client.poll() is None
    assert daemons_of(site.pipe) == [d.pid]


def test_the_pasted_commands_act_on_the_config_given(site: Site, tmp_path: Path) -> None:
    """A config file in a dir with a space: the quoted command splits back to it."""
    d = site.start_daemon()
    spaced = tmp_path / "my site"
    spaced.mkdir()
    cfg = str(spaced / "mps health.yaml")
    Path(cfg).write_text(Path(site.config(remediating(site))).read_text())
    site.pipe.chmod(0o700)
    assert paste_all(cfg) == ["pipe-dir-mode"]
    assert node_problems(cfg) == [] and daemons_of(site.pipe) == [d.pid]
