"""daemon and directories checks over --root fixture trees (captured /proc, real sockets)."""

import os
from pathlib import Path

import pytest
from clirun import mps_health
from hostile import fake_squeue, squeue_line
from mps_health.config.load import from_mapping
from mps_health.engine import run as engine
from mps_health.model.results import CRITICAL, OK, WARNING
from roottree import RUNNING_ENTRIES, add_dir, add_pipe_dir, add_process


def judge(root: Path, mapping: dict, only=("daemon", "directories", "strays")):
    (root / "proc").mkdir(exist_ok=True)  # a node with no MPS process at all
    cfg = from_mapping({"run_dir": str(root / "run"), **mapping}, None)
    _, report = engine.run(cfg, str(root), only=list(only))
    return report, {(r.instance, f"{r.check}-ok" if r.code == "ok" else r.code): r
                    for run in report.runs for r in run.results}


def healthy_node(root: Path, pid: int = 4242) -> None:
    add_process(root, pid, pipe_dir="/tmp/nvidia-mps")
    add_pipe_dir(root, "/tmp/nvidia-mps", pid)
    add_dir(root, "/var/log/nvidia-mps")


def test_healthy_tree(tmp_path: Path) -> None:
    healthy_node(tmp_path)
    report, found = judge(tmp_path, {})
    assert report.state == OK, report
    assert found[("node", "daemon-ok")].values == (("daemon_up", 1.0), ("daemon_pid", 4242.0))


def test_stale_after_sigkill(tmp_path: Path) -> None:
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps", 4242)  # all five entries stay, no process
    add_dir(tmp_path, "/var/log/nvidia-mps")
    _report, found = judge(tmp_path, {})
    r = found[("node", "daemon-stale")]
    assert r.state == CRITICAL and "pid file names 4242" in r.message


def test_after_clean_quit_is_absent_not_stale(tmp_path: Path) -> None:
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps", None, entries=("control_lock",))
    add_dir(tmp_path, "/var/log/nvidia-mps")
    _, found = judge(tmp_path, {})
    assert ("node", "daemon-absent") in found


def test_zombie_launcher_is_not_a_daemon(tmp_path: Path) -> None:
    add_process(tmp_path, 10, state="Z")
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps", 10)
    add_dir(tmp_path, "/var/log/nvidia-mps")
    _, found = judge(tmp_path, {})
    assert ("node", "daemon-stale") in found


@pytest.mark.parametrize("state,code,severity,up", [
    ("T", "daemon-stopped", CRITICAL, 0.0), ("D", "daemon-uninterruptible", WARNING, 1.0)])
def test_stopped_and_stuck(tmp_path: Path, state: str, code: str, severity: int,
                           up: float) -> None:
    add_process(tmp_path, 4242, state=state, pipe_dir="/tmp/nvidia-mps")
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps", 4242)
    add_dir(tmp_path, "/var/log/nvidia-mps")
    _, found = judge(tmp_path, {})
    assert found[("node", code)].state == severity
    # A stopped daemon serves no one: the fleet alert's count(daemon_up == 0) counts it.
    assert dict(found[("node", code)].values)["daemon_up"] == up


def test_two_daemons_one_dir_and_orphan_server(tmp_path: Path) -> None:
    healthy_node(tmp_path, 4242)
    add_process(tmp_path, 4243, pipe_dir="/tmp/nvidia-mps")
    add_process(tmp_path, 5000, role="server", pipe_dir="/tmp/old", ppid=1)
    _, found = judge(tmp_path, {})
    assert found[("node", "daemon-duplicate")].state == CRITICAL
    # A tree's /proc shows no binary to check and a tree run keeps no memory of servers:
    # a server without a daemon may be a process only named like one, or anyone's, so it
    # is the WARNING server-unclaimed here, never server-orphaned.
    assert ("", "server-orphaned") not in found
    assert found[("", "server-unclaimed")].state == WARNING
    assert "could not be checked" in found[("", "server-unclaimed")].message


def test_root_daemon_where_per_user_required(tmp_path: Path) -> None:
    healthy_node(tmp_path)
    _, found = judge(tmp_path, {"mps": {"forbid_root_daemon": True}})
    assert found[("node", "daemon-root")].state == CRITICAL


def test_per_gpu_instances_are_kept_apart(tmp_path: Path) -> None:
    add_process(tmp_path, 100, pipe_dir="/tmp/nvidia-mps_0")
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps_0", 100)
    add_pipe_dir(tmp_path, "/tmp/nvidia-mps_1", 101)  # GPU 1's daemon was killed
    for g in (0, 1):
        add_dir(tmp_path, f"/var/log/nvidia-mps_{g}")
    _report, found = judge(tmp_path, {"mps": {"layout": "per-gpu", "gpus": [0, 1]}})
    assert ("gpu0", "daemon-ok") in found
    assert found[("gpu1", "daemon-stale")].state == CRITICAL
    assert not [k for k in found if k[0] == "gpu0" and not k[1].endswith("-ok")]


def test_per_job_dirs_are_discovered(tmp_path: Path) -> None:
    add_process(tmp_path, 300, uid=1000, pipe_dir="/tmp/nvidia-mps_job77")
    d = add_pipe_dir(tmp_path, "/tmp/nvidia-mps_job77", 300, mode=0o700)
    for path in (d, *d.iterdir()):  # the job user's daemon made them
        os.chown(path, 1000, 1000, follow_symlinks=False)
    add_dir(tmp_path, "/tmp/nvidia-log_job77", 0o700)
    add_dir(tmp_path, "/tmp/unrelated")
    squeue = fake_squeue(tmp_path, [squeue_line("77", "someone", uid=1000)])
    mapping = {"mps": {"layout": "per-job", "dir_mode": "0700"}, "commands": {"squeue": squeue}}
    report, found = judge(tmp_path, mapping)
    assert report.state == OK, found
    assert ("job77", "daemon-ok") in found


def test_symlinked_pipe_dir_is_critical_and_not_followed(tmp_path: Path) -> None:
    secret = add_dir(tmp_path, "/etc/secret", 0o700)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp/nvidia-mps").symlink_to(secret)
    add_dir(tmp_path, "/var/log/nvidia-mps")
    _, found = judge(tmp_path, {})
    r = found[("node", "pipe-dir-symlink")]
    assert r.state == CRITICAL and str(secret) in r.message
    assert ("node", "pipe-dir-mode") not in found  # the target's 0700 is not looked at


def test_mode_owner_and_missing_log(tmp_path: Path) -> None:
    add_process(tmp_path, 4242, pipe_dir="/tmp/nvidia-mps")
    d = add_pipe_dir(tmp_path, "/tmp/nvidia-mps", 4242, mode=0o700)
    os.chown(d, 65534, 65534)
    _, found = judge(tmp_path, {})
    assert found[("node", "pipe-dir-mode")].state == CRITICAL
    assert "mode 0700, expected 0777" in found[("node", "pipe-dir-mode")].message
    assert found[("node", "pipe-dir-owner")].state == WARNING
    assert found[("node", "log-dir-missing")].state == WARNING


def test_pipe_path_too_long(tmp_path: Path) -> None:
    long_dir = "/tmp/" + "x" * 90
    _, found = judge(tmp_path, {"mps": {"pipe_dir": long_dir}}, only=("directories",))
    assert found[("node", "pipe-path-too-long")].state == CRITICAL


def test_planted_symlink_entry(tmp_path: Path) -> None:
    healthy_node(tmp_path)
    ctl = tmp_path / "tmp/nvidia-mps/control"
    ctl.unlink()
    ctl.symlink_to("/etc/shadow")
    _, found = judge(tmp_path, {})
    assert found[("node", "pipe-entry-bad")].state == CRITICAL


def test_cli_with_root_tree(tmp_path: Path, site) -> None:
    healthy_node(tmp_path)
    cfg = site.write("c.yaml", f"run_dir: {tmp_path}/run\n")
    r = mps_health("check", "--root", str(tmp_path), "--config", cfg, "--only",
                   "daemon,directories", timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(RUNNING_ENTRIES) <= set(os.listdir(tmp_path / "tmp/nvidia-mps"))
