"""``mps-health remediate dirs``: a dir fault fixed in place, the daemon and its clients
untouched; what only a restart fixes left to ``remediate reset``. On private trees with
the fake daemon and fake clients."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from clirun import mps_health
from nodesite import Daemon, Site
from remhelp import alive, daemons_of, remediating


def dirs(cfg: str, *extra: str) -> subprocess.CompletedProcess:
    return mps_health("remediate", "dirs", "--config", cfg, *extra)


def findings(cfg: str, instance: str = "node") -> dict:
    """The directories check's findings for our instance, by code (other engineers'
    daemons on this machine are other instances' business)."""
    r = mps_health("check", "--config", cfg, "--only", "directories", "--format", "json")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    return {p["code"]: p for p in json.loads(r.stdout)["problems"]
            if p["instance"] == instance}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def snapshot(path: Path) -> dict:
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        st = os.lstat(p)
        out[str(p)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                       st.st_ino, st.st_mtime_ns)
    return out


@pytest.fixture
def clients() -> Iterator[List[subprocess.Popen]]:
    """Stand-ins for CUDA clients: real processes, killed by PID afterwards."""
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


@pytest.fixture
def served(site: Site, clients: List[subprocess.Popen]) -> Tuple[Daemon, int, int, str]:
    """A daemon with a server and a connected client: (daemon, server pid, client pid,
    config)."""
    d = site.start_daemon()
    client = subprocess.Popen(["sleep", "300"])
    clients.append(client)
    server = int(d.query(f"fake_client_connect {client.pid}").stdout)
    return d, server, client.pid, site.config(remediating(site))


def untouched(site: Site, d: Daemon, server: int, client: int) -> None:
    assert daemons_of(site.pipe) == [d.pid]
    assert alive(server) and alive(client)
    assert d.query("get_server_list").stdout.split() == [str(server)]


def test_a_0700_pipe_dir_is_fixed_in_place_daemon_and_client_untouched(site: Site,
                                                                       served) -> None:
    d, server, client, cfg = served
    site.pipe.chmod(0o700)
    found = findings(cfg)["pipe-dir-mode"]
    assert found["action"].startswith("run 'mps-health remediate dirs node --config ")
    assert "remediate reset" not in found["action"]
    r = dirs(cfg, "node")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"in use by: control {d.pid} (uid 0), server {server}" in r.stdout
    assert f"change mode of {site.pipe} from 0700 to 0777" in r.stdout
    assert "mode 0700 -> 0777" in r.stdout and "the daemon was not touched" in r.stdout
    assert mode(site.pipe) == 0o777
    untouched(site, d, server, client)
    assert "control" in os.listdir(site.pipe)  # the daemon's entries are its own
    assert findings(cfg) == {}
    audit = (site.root / "audit.log").read_text().splitlines()
    events = [dict(w.split("=", 1) for w in line.split() if "=" in w)["event"]
              for line in audit]
    assert events == ["begin", "step-pipe-dir", "finish"]
    assert all("action=dirs" in line and "instance=node" in line for line in audit)
    assert "result=ok" in audit[1] and "result=ok" in audit[2]
    again = dirs(cfg)  # every instance: nothing left to do
    assert again.returncode == 0 and "dirs are right: nothing to do" in again.stdout
    assert "event=checked result=healthy" in (site.root / "audit.log").read_text()


def test_dry_run_prints_the_plan_and_changes_nothing(site: Site, served) -> None:
    d, server, client, cfg = served
    site.pipe.chmod(0o700)
    site.log.chmod(0o777)
    before = snapshot(site.pipe) | snapshot(site.log)
    r = dirs(cfg, "node", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"1. change mode of {site.pipe} from 0700 to 0777" in r.stdout
    assert f"2. change mode of {site.log} from 0777 to 0755" in r.stdout
    assert r.stdout.rstrip().endswith("dry run: nothing was changed")
    assert snapshot(site.pipe) | snapshot(site.log) == before
    assert not (site.root / "audit.log").exists()
    untouched(site, d, server, client)


def test_log_dir_mode_alone_is_a_dirs_repair_and_reset_plans_no_restart(site: Site,
                                                                        served) -> None:
    """A client connected: a reset for a log-dir-mode alone is neither refused nor a
    restart; it puts the mode right, as 'remediate dirs' does."""
    d, server, client, cfg = served
    site.log.chmod(0o777)
    found = findings(cfg)["log-dir-mode"]
    assert found["action"].startswith("run 'mps-health remediate dirs node --config ")
    plan = mps_health("remediate", "reset", "--config", cfg, "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "fixed in place, as 'mps-health remediate dirs node' does, no restart" in plan.stdout
    assert f"change mode of {site.log} from 0777 to 0755" in plan.stdout
    assert "quit" not in plan.stdout and "start '" not in plan.stdout
    r = mps_health("remediate", "reset", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert mode(site.log) == 0o755
    untouched(site, d, server, client)


def test_a_missing_log_dir_is_made_while_the_daemon_runs(site: Site, served) -> None:
    d, server, client, cfg = served
    shutil.rmtree(site.log)
    assert findings(cfg)["log-dir-missing"]["action"].startswith(
        "run 'mps-health remediate dirs node --config ")
    r = dirs(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    st = os.lstat(site.log)
    assert stat.S_ISDIR(st.st_mode) and mode(site.log) == 0o755 and st.st_uid == 0
    untouched(site, d, server, client)


def test_a_symlinked_pipe_dir_under_a_daemon_is_left_to_reset(site: Site, served) -> None:
    """The daemon's sockets live in what the link leads to: moving the link aside would
    leave it broken, so only a reset fixes it, and 'dirs' says so and changes nothing."""
    d, server, client, cfg = served
    real = site.root / "real-pipe"
    os.rename(site.pipe, real)
    site.pipe.symlink_to(real)
    found = findings(cfg)["pipe-dir-symlink"]
    assert "remediate reset node" in found["action"] and "remediate dirs" not in found["action"]
    r = dirs(cfg, "node")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"refused: pipe dir {site.pipe} is a symlink to {real} while control {d.pid}"
            in r.stdout)
    assert "run 'mps-health remediate reset node'" in r.stdout
    assert os.readlink(site.pipe) == str(real)
    assert daemons_of(site.pipe) == [d.pid] and alive(server) and alive(client)
    audit = (site.root / "audit.log").read_text()
    assert "event=refused result=refused" in audit and "event=begin" not in audit


def test_a_symlinked_pipe_dir_without_a_daemon_is_moved_aside(site: Site) -> None:
    target = site.root / "elsewhere"
    target.mkdir(mode=0o700)
    site.dirs()
    site.pipe.rmdir()
    site.pipe.symlink_to(target)
    before = snapshot(target)
    cfg = site.config(remediating(site))
    r = dirs(cfg, "node")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in use by: no daemon or server" in r.stdout
    st = os.lstat(site.pipe)
    assert stat.S_ISDIR(st.st_mode) and mode(site.pipe) == 0o777 and st.st_uid == 0
    aside = [p for p in site.root.iterdir() if p.name.startswith("mps-pipe.aside-")]
    assert len(aside) == 1 and os.readlink(aside[0]) == str(target)
    assert snapshot(target) == before  # never followed
    assert daemons_of(site.pipe) == []  # a dirs repair starts no daemon


def test_an_unknown_instance_is_one_line_exit_3(site: Site) -> None:
    site.dirs()
    r = dirs(site.config(remediating(site)), "gpu9")
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr == "mps-health: no MPS instance named 'gpu9' on this node (known: node)\n"
