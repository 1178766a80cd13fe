"""Helpers for the remediation tests: their config settings, a test user, processes by PID."""

import os
import pwd
import signal
import time
from pathlib import Path
from typing import List

import pytest
from mps_health.probes.proc import read_processes
from nodesite import Config, Site
from paths import FAKE_CONTROL

TEST_USER = "mpsh-remtest"


@pytest.fixture(scope="session")
def test_user() -> pwd.struct_passwd:
    """An ordinary user for foreign-owned dirs and per-user daemons, created once per
    machine and kept, as the attack tests' users are: a run that removed it at its end
    would pull it from under another test run on the same machine."""
    from hostile import ensure_user

    return ensure_user(TEST_USER)


def remediating(site: Site) -> Config:
    """What the remediation tests add to a site's config: the fake control binary, short
    timeouts, no repair cooldown, and the audit log in the site (never syslog)."""
    return {
        "commands": {"nvidia-cuda-mps-control": FAKE_CONTROL},
        "control": {"timeout_s": 1.0},
        "mps": {"layout": "node"},
        # cooldown_s 0: tests restart an instance many times on purpose; the cooldown's
        # own tests set it.
        "remediation": {**audit_in(site)["remediation"],
                        "quit_timeout_s": 2, "term_timeout_s": 2, "verify_timeout_s": 10,
                        "cooldown_s": 0},
    }


def audit_in(site: Site) -> Config:
    """The audit trail of a repair in the site: its audit log there, never syslog (for a
    test that keeps everything else of its config as it is)."""
    return {"remediation": {"audit_log": f"{site.root}/audit.log", "syslog": False}}


def killed_daemon(site: Site) -> str:
    """A site whose daemon was killed (SIGKILL, waited for), its dirs left behind: the
    config, remediating."""
    d = site.start_daemon()
    cfg = site.config(remediating(site))
    kill_and_wait(d.pid)
    return cfg


def make_dirs(*paths: Path, mode: int = 0o777) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)
        p.chmod(mode)


def kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL ``pid`` (one we started) and wait until it is a zombie or reaped."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"{pid} still runs after SIGKILL"
        time.sleep(0.01)


def daemons_of(pipe: Path) -> List[int]:
    return [p.pid for p in read_processes("/proc")
            if p.role == "control" and p.pipe_dir == str(pipe) and p.state not in ("Z", "X")]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def environ_of(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid
