"""Attacks on the daemon's log dir, run as an unprivileged user against the fake daemon.

A log dir any user can write (0777, as older ``unit prepare`` and resets made it) lets
them put a link as ``control.log``: the root daemon appends its log (every client
command, verbatim) to whatever it leads to. Or they write a ``control.log`` of their own
with fatal lines. Neither may be followed, read or believed: the check names the user
(a WARNING, never CRITICAL), and ``unit prepare`` and ``remediate reset`` put the entry
out of the way before the root daemon starts, and leave a log dir only root can write.
"""

import json
import os
import stat
import time
from pathlib import Path
from typing import Tuple

import pytest
from clirun import mps_health
from hostile import ATTACKER, ensure_user, run_as
from mpsdaemon import start_daemon
from nodesite import Site
from remhelp import daemons_of, remediating

FATAL = "[{} Server   510] fatal exception: forged by a user\n"


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S.000")


@pytest.fixture
def attacker_uid() -> int:
    return ensure_user(ATTACKER).pw_uid


@pytest.fixture
def old_node(site: Site) -> Tuple[Path, Path, Path]:
    """Pipe and log dir as older releases made them (both 0777, root's), and a root file
    a user would like the root daemon to write to."""
    pipe, log = site.dirs(log_mode=0o777)
    secret = site.root / "root-only"
    secret.mkdir(mode=0o700)
    target = secret / "shadow"
    target.write_text("root:secret\n")
    target.chmod(0o644)
    return pipe, log, target


def plant_link(log: Path, target: Path, name: str = "control.log") -> None:
    r = run_as(ATTACKER, ["ln", "-s", str(target), str(log / name)])
    assert r.returncode == 0, r.stderr


def check(cfg: str, only: str = "logs,directories") -> Tuple[int, dict]:
    r = mps_health("check", "--config", cfg, "--only", only, "--format", "json")
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def codes(report: dict) -> dict:
    return {p["code"]: p for p in report["problems"]}


def assert_closed_to_users(log: Path) -> None:
    st = os.lstat(log)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    r = run_as(ATTACKER, ["touch", str(log / "mine")])
    assert r.returncode != 0 and not (log / "mine").exists()


def test_a_linked_control_log_is_reported_naming_the_user_never_followed(
        site: Site, old_node, attacker_uid: int) -> None:
    pipe, log, target = old_node
    target.write_text("root:secret\n" + FATAL.format(_stamp()))  # read if followed
    plant_link(log, target)
    before = target.read_bytes()
    rc, report = check(site.config(pipe=pipe, log=log))
    found = codes(report)
    assert rc == 1, report["problems"]
    bad = found["log-file-bad"]
    assert bad["state"] == "WARNING" and f"owned by uid {attacker_uid}" in bad["message"]
    assert "symlink" in bad["message"]
    assert "log-fatal" not in found  # the link's target was not read
    assert found["log-dir-mode"]["state"] == "WARNING"
    action = found["log-dir-mode"]["action"]
    assert action.startswith("run 'mps-health remediate dirs node"), action
    assert action.endswith("(runbook: mps-health explain log-dir-mode)"), action
    assert all(p["state"] != "CRITICAL" for p in report["problems"])
    assert target.read_bytes() == before


def test_a_forged_control_log_gives_no_log_fatal(site: Site, old_node,
                                                 attacker_uid: int) -> None:
    pipe, log, _ = old_node
    forged = "".join(FATAL.format(_stamp()) for _ in range(3))
    r = run_as(ATTACKER, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", forged,
                          str(log / "control.log")])
    assert r.returncode == 0, r.stderr
    plant_link(log, Path("/etc/passwd"), "notes")
    rc, report = check(site.config(pipe=pipe, log=log))
    found = codes(report)
    assert "log-fatal" not in found, found
    assert f"a file owned by uid {attacker_uid}" in found["log-file-bad"]["message"]
    foreign = found["log-entry-foreign"]
    assert foreign["state"] == "WARNING" and f"uid {attacker_uid}" in foreign["message"]
    assert f"{log}/notes" in foreign["message"]
    assert rc == 1 and all(p["state"] != "CRITICAL" for p in report["problems"])


def test_unit_prepare_removes_the_link_before_the_daemon_starts(site: Site, old_node,
                                                                 attacker_uid: int) -> None:
    pipe, log, target = old_node
    plant_link(log, target)
    r = run_as(ATTACKER, ["mkfifo", str(log / "server.log")])
    assert r.returncode == 0, r.stderr
    before = target.read_bytes()
    cfg = site.config(pipe=pipe, log=log)
    r = mps_health("unit", "prepare", "--pipe-dir", str(pipe), "--log-dir", str(log),
                   "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{log}/control.log was a symlink owned by uid {attacker_uid}" in r.stdout
    assert "removed the link (its target untouched)" in r.stdout
    assert f"{log}/server.log was a fifo owned by uid {attacker_uid}" in r.stdout
    aside = [p for p in log.iterdir() if p.name.startswith(".server.log.foreign-")]
    assert len(aside) == 1 and stat.S_ISFIFO(os.lstat(aside[0]).st_mode)
    assert "mode 0777 -> 0755" in r.stdout
    assert_closed_to_users(log)
    assert stat.S_IMODE(os.lstat(pipe).st_mode) == 0o777  # clients still connect
    start_daemon(pipe, log)  # what the unit's ExecStart does next
    control_log = os.lstat(log / "control.log")
    assert stat.S_ISREG(control_log.st_mode) and control_log.st_uid == 0
    assert target.read_bytes() == before
    again = mps_health("unit", "prepare", "--pipe-dir", str(pipe), "--log-dir", str(log),
                       "--config", cfg)
    assert again.returncode == 0 and "control.log was" not in again.stdout, again.stdout


def test_reset_removes_the_link_before_the_daemon_starts(site: Site, old_node,
                                                         attacker_uid: int) -> None:
    pipe, log, target = old_node
    plant_link(log, target)
    before = target.read_bytes()
    cfg = site.config(remediating(site), pipe=pipe, log=log)
    dry = mps_health("remediate", "reset", "--config", cfg, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "control.log and server.log are regular files of root" in dry.stdout
    assert "change mode of" in dry.stdout and "from 0777 to 0755" in dry.stdout
    r = mps_health("remediate", "reset", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{log}/control.log was a symlink owned by uid {attacker_uid}" in r.stdout
    assert len(daemons_of(pipe)) == 1
    control_log = os.lstat(log / "control.log")
    assert stat.S_ISREG(control_log.st_mode) and control_log.st_uid == 0
    assert "Starting control daemon" in (log / "control.log").read_text()
    assert target.read_bytes() == before
    assert_closed_to_users(log)
    audit = (site.root / "audit.log").read_text()
    assert f"control.log was a symlink owned by uid {attacker_uid}" in audit
    rc, report = check(cfg, "logs,directories,daemon")
    assert rc == 0, report["problems"]


def test_a_log_dir_made_by_reset_is_closed_to_users(site: Site) -> None:
    pipe = site.root / "mps-pipe"
    log = site.root / "mps-log"
    cfg = site.config(remediating(site), pipe=pipe, log=log)
    r = mps_health("remediate", "reset", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"created {log} mode 0755" in r.stdout
    assert_closed_to_users(log)
