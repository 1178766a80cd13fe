"""``mps-health remediate reset`` end to end, on private trees with the fake daemon."""
# ruff: noqa: F811  (the fixture test_user comes from remhelp)

import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from clirun import mps_health
from mps_health.config.load import ConfigError, load
from mps_health.hostio.filelock import node_lock
from mpsdaemon import start_daemon, stop_process
from remhelp import (  # noqa: F401
    alive,
    daemons_of,
    environ_of,
    kill_and_wait,
    make_dirs,
    remediating,
    test_user,
    uid_of,
)


def reset(cfg: str, *extra: str, env=None) -> subprocess.CompletedProcess:
    return mps_health("remediate", "reset", "--config", cfg, *extra, env=env)


def instance_problems(cfg: str, instance: str = "node") -> list:
    """What the core checks find wrong with our instance (other helpers' daemons on this
    shared machine show up as node-wide 'daemon-unexpected' findings: not ours to judge)."""
    r = mps_health("check", "--config", cfg, "--only", "daemon,control,directories",
                   "--format", "json")
    assert r.returncode in (0, 1, 2), r.stderr
    return [p for p in json.loads(r.stdout)["problems"] if p["instance"] == instance]


def snapshot(path: Path) -> dict:
    """Everything about a site.root that a reset must not change."""
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        st = os.lstat(p)
        out[str(p)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                       st.st_mtime_ns, p.read_bytes() if p.is_file() else b"")
    return out


def test_missing_daemon_is_started_and_a_second_reset_only_verifies(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result: node is healthy again" in r.stdout
    assert instance_problems(cfg) == []
    first = daemons_of(site.pipe)
    assert len(first) == 1
    again = reset(cfg)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "node is healthy: nothing to do" in again.stdout
    assert daemons_of(site.pipe) == first  # untouched
    audit = (site.root / "audit.log").read_text()
    assert "event=begin" in audit and "event=finish result=ok" in audit
    assert "event=checked result=healthy" in audit


def test_stale_dir_after_sigkill_is_cleared_and_restarted(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    pid = start_daemon(site.pipe, site.log)
    kill_and_wait(pid)
    assert (site.pipe / "control").exists()  # stale socket left behind
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "daemon-stale" in r.stdout
    assert "removed stale control" in r.stdout
    assert instance_problems(cfg) == []


def test_a_stopped_daemon_is_continued_first_not_replaced(site) -> None:
    # SIGCONT serves everyone again and keeps the daemon's servers and their jobs, where
    # a restart would end them: the reset frees it first and then finds nothing to do.
    site.dirs()
    cfg = site.config(remediating(site))
    pid = start_daemon(site.pipe, site.log)
    stop_process(pid)
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"continue pid {pid}" in r.stdout and "the daemon answers again" in r.stdout
    assert "nothing to do" in r.stdout
    assert daemons_of(site.pipe) == [pid]
    assert instance_problems(cfg) == []


def test_wrong_mode_is_fixed_through_the_fd(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    start_daemon(site.pipe, site.log)
    site.pipe.chmod(0o700)
    old_umask = os.umask(0o077)  # the fix must not depend on the caller's umask
    try:
        r = reset(cfg)
    finally:
        os.umask(old_umask)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mode 0700 -> 0777" in r.stdout
    assert stat.S_IMODE(os.lstat(site.pipe).st_mode) == 0o777


def test_symlinked_pipe_dir_is_moved_aside_and_its_target_untouched(site,
                                                                     test_user) -> None:
    sensitive = site.root / "etc-like"
    sensitive.mkdir(mode=0o700)
    (sensitive / "shadow").write_text("secret\n")
    (sensitive / "shadow").chmod(0o600)
    make_dirs(site.log)
    site.pipe.symlink_to(sensitive)
    os.lchown(site.pipe, test_user.pw_uid, test_user.pw_gid)  # planted by a user
    before = snapshot(sensitive)
    cfg = site.config(remediating(site))
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pipe-dir-symlink" in r.stdout
    assert snapshot(sensitive) == before  # not chmod-ed, nothing created or removed in it
    pipe = os.lstat(site.pipe)
    assert stat.S_ISDIR(pipe.st_mode) and pipe.st_uid == 0
    assert stat.S_IMODE(pipe.st_mode) == 0o777
    aside = [p for p in site.root.iterdir() if p.name.startswith("mps-pipe.aside-")]
    assert len(aside) == 1 and aside[0].is_symlink()
    assert os.readlink(aside[0]) == str(sensitive)
    assert instance_problems(cfg) == []


def test_symlink_to_a_real_system_dir_leaves_it_alone(site) -> None:
    make_dirs(site.log)
    site.pipe.symlink_to("/etc")
    st = os.stat("/etc")
    names = sorted(os.listdir("/etc"))
    r = reset(site.config(remediating(site)))
    assert r.returncode == 0, r.stdout + r.stderr
    after = os.stat("/etc")
    assert (after.st_mode, after.st_uid, after.st_gid) == (st.st_mode, st.st_uid, st.st_gid)
    assert sorted(os.listdir("/etc")) == names
    assert not os.path.exists("/etc/control") and not os.path.exists("/etc/control_lock")


def test_pipe_dir_owned_by_another_user_is_moved_aside_intact(site, test_user) -> None:
    site.dirs()
    (site.pipe / "planted").write_text("x")
    os.chown(site.pipe / "planted", test_user.pw_uid, test_user.pw_gid)
    os.chown(site.pipe, test_user.pw_uid, test_user.pw_gid)
    cfg = site.config(remediating(site))
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "owned by someone else" in r.stdout
    aside = [p for p in site.root.iterdir() if p.name.startswith("mps-pipe.aside-")]
    assert len(aside) == 1
    assert os.lstat(aside[0]).st_uid == test_user.pw_uid  # never chown-ed through
    assert (aside[0] / "planted").read_text() == "x"
    assert os.lstat(site.pipe).st_uid == 0
    assert instance_problems(cfg) == []


def test_pid_file_naming_an_unrelated_process_does_not_get_it_killed(site) -> None:
    make_dirs(site.pipe, site.log, site.root / "other-pipe", site.root / "other-log")
    other = start_daemon(site.root / "other-pipe", site.root / "other-log")  # another instance's daemon
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        for victim in (bystander.pid, other):
            pid = start_daemon(site.pipe, site.log)
            kill_and_wait(pid)  # nothing writes the pid file after this
            (site.pipe / "nvidia-cuda-mps-control.pid").write_text(str(victim))
            # Two restarts in a row on purpose: no cooldown between them.
            r = reset(site.config(remediating(site), remediation={"cooldown_s": 0}))
            assert r.returncode == 0, r.stdout + r.stderr
            assert f"the pid file names {victim}" in r.stdout
            assert alive(victim), f"{victim} was killed"
            for d in daemons_of(site.pipe):
                os.kill(d, signal.SIGKILL)
        assert bystander.poll() is None
        assert alive(other)
    finally:
        bystander.kill()
        bystander.wait()


def test_connected_clients_make_reset_refuse_until_forced(site) -> None:
    site.dirs()
    client = subprocess.Popen(["sleep", "300"], env=dict(os.environ, SLURM_JOB_ID="4242"))
    try:
        # The fake answers every query with FAKE_MPS_REPLY: one server and one client, both
        # the PID of our stand-in client process.
        pid = start_daemon(site.pipe, site.log, env={"FAKE_MPS_REPLY": str(client.pid)})
        # Something only a restart repairs (a dir mode alone is fixed in place, with no
        # refusal: test_remediation_dirs.py): the daemon's 'log' FIFO made a file.
        (site.pipe / "log").unlink()
        (site.pipe / "log").write_text("")
        cfg = site.config(remediating(site))
        r = reset(cfg)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "pipe-entry-bad" in r.stdout
        # Its SLURM_JOB_ID is its own word (no Slurm cgroup here): said as such.
        assert f"refused: 1 client(s) connected: {client.pid} (says job 4242)" in r.stdout
        assert stat.S_ISREG(os.lstat(site.pipe / "log").st_mode)  # nothing changed
        assert daemons_of(site.pipe) == [pid]
        forced = reset(cfg, "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert client.poll() is None  # clients are never signalled by us
        assert daemons_of(site.pipe) not in ([], [pid])
    finally:
        client.kill()
        client.wait()


def test_healthy_instance_is_restarted_only_with_force(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    pid = start_daemon(site.pipe, site.log)
    r = reset(cfg)
    assert r.returncode == 0 and "nothing to do" in r.stdout
    assert daemons_of(site.pipe) == [pid]
    forced = reset(cfg, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "the daemon accepted 'quit'" in forced.stdout
    new = daemons_of(site.pipe)
    assert len(new) == 1 and new != [pid]


def test_dry_run_prints_the_plan_and_changes_nothing(site) -> None:
    make_dirs(site.log, site.root / "target")
    site.pipe.symlink_to(site.root / "target")
    before = snapshot(site.root)
    r = reset(site.config(remediating(site)), "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "move " in r.stdout and "dry run: nothing was changed" in r.stdout
    # Only the config written and the core's query lock (as 'mps-health check' makes) differ.
    skip = (str(site.root), str(site.root / "config.yaml"), str(site.root / "run"))
    after = {k: v for k, v in snapshot(site.root).items() if not k.startswith(skip)}
    assert after == {k: v for k, v in before.items() if not k.startswith(skip)}
    assert not (site.root / "audit.log").exists()
    assert daemons_of(site.pipe) == []


def test_two_resets_at_once_take_turns(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    pid = start_daemon(site.pipe, site.log)
    os.kill(pid, signal.SIGKILL)
    results = []

    def one() -> None:
        results.append(reset(cfg))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
    outs = sorted(r.stdout for r in results)
    assert sum("result: node is healthy again" in o for o in outs) == 1
    assert sum("node is healthy: nothing to do" in o for o in outs) == 1
    assert len(daemons_of(site.pipe)) == 1


def test_a_reset_waits_a_bounded_time_for_the_lock(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site), remediation={"lock_wait_s": 0.5})
    held = node_lock(str(site.root / "run")).acquire(0, "reset node (held by the test)")
    try:
        t0 = time.monotonic()
        r = reset(cfg)
        waited = time.monotonic() - t0
    finally:
        held.release()
    assert r.returncode == 3
    assert r.stdout == ""
    assert "another remediation holds" in r.stderr and "held by the test" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert waited < 20


def test_per_gpu_reset_touches_only_its_instance_and_sets_cuda_visible_devices(
        site) -> None:
    for g in ("0", "1"):
        make_dirs(site.root / f"pipe{g}", site.root / f"log{g}")
    cfg = site.config(remediating(site), mps={"layout": "per-gpu", "gpus": [0, 1]},
                      pipe=f"{site.root}/pipe{{gpu}}", log=f"{site.root}/log{{gpu}}")
    gpu0 = start_daemon(site.root / "pipe0", site.root / "log0")
    no_name = reset(cfg)
    assert no_name.returncode == 3 and "name the instance to reset (gpu0, gpu1)" in no_name.stderr
    r = reset(cfg, "gpu1")
    assert r.returncode == 0, r.stdout + r.stderr
    (gpu1,) = daemons_of(site.root / "pipe1")
    assert environ_of(gpu1)["CUDA_VISIBLE_DEVICES"] == "1"
    assert daemons_of(site.root / "pipe0") == [gpu0]
    assert reset(cfg, "gpu7").returncode == 3


def test_daemon_runs_as_the_configured_user_with_dirs_owned_by_them(site,
                                                                     test_user) -> None:
    site.dirs()
    cfg = site.config(remediating(site), mps={"daemon_user": test_user.pw_name,
                                              "dir_owner": test_user.pw_name})
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    (pid,) = daemons_of(site.pipe)
    assert uid_of(pid) == test_user.pw_uid
    env = environ_of(pid)
    assert env["USER"] == test_user.pw_name and "SUDO_USER" not in env
    assert os.lstat(site.pipe).st_uid == test_user.pw_uid
    assert (site.pipe / "control").lstat().st_uid == test_user.pw_uid
    assert instance_problems(cfg) == []


def test_the_log_dir_is_the_daemons_users_when_root_owns_the_pipe_dir(site,
                                                                      test_user) -> None:
    """Only the daemon writes its logs, and its log dir is 0755: a daemon of another user
    than mps.dir_owner gets a log dir of its own, or it could not log at all."""
    site.dirs()
    cfg = site.config(remediating(site), mps={"daemon_user": test_user.pw_name})
    r = reset(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    (pid,) = daemons_of(site.pipe)
    assert uid_of(pid) == test_user.pw_uid
    assert (os.lstat(site.pipe).st_uid, stat.S_IMODE(os.lstat(site.pipe).st_mode)) == (0, 0o777)
    log = os.lstat(site.log)
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (test_user.pw_uid, 0o755)
    assert (site.log / "control.log").lstat().st_uid == test_user.pw_uid  # it could log
    assert instance_problems(cfg) == []


def test_audit_names_the_person_behind_sudo(site) -> None:
    site.dirs()
    r = reset(site.config(remediating(site)), env={"SUDO_USER": "alice"})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = (site.root / "audit.log").read_text().splitlines()
    assert lines and all('who="alice (via sudo as root)"' in line for line in lines)
    assert any("event=step-start result=ok" in line for line in lines)


def test_bad_remediation_config_is_one_line(site) -> None:
    cfg = site.config(remediating(site), remediation={"lock_wait_s": "soon"})
    r = reset(cfg)
    assert r.returncode == 3
    assert r.stderr.strip() == (f"mps-health: {cfg}: key 'remediation.lock_wait_s': must be a "
                                "number between 0 and 3600 (got 'soon')")
    with pytest.raises(ConfigError):  # whoever loads the file: the whole file is checked
        load(cfg, table=None)



def test_audit_goes_to_syslog_too(site) -> None:
    """The syslog module writes to /dev/log: listen there (only where no syslog daemon
    owns it, so nothing real is disturbed)."""
    import socket

    import pytest
    from hostpaths import SYSLOG_LISTENED

    if os.path.lexists("/dev/log"):
        pytest.skip("/dev/log belongs to this machine's syslog daemon")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind("/dev/log")
    except OSError as e:
        pytest.skip(f"cannot listen on /dev/log: {e}")
    try:
        site.dirs()
        cfg = site.config(remediating(site), remediation={"syslog": True})
        r = reset(cfg, env={SYSLOG_LISTENED: "1"})  # the tripwire: this syslog is ours
        assert r.returncode == 0, r.stdout + r.stderr
        sock.settimeout(2.0)
        got = []
        try:
            while True:
                got.append(sock.recv(65536).decode())
        except socket.timeout:
            pass
    finally:
        sock.close()
        os.unlink("/dev/log")
    ours = [m for m in got if " mps-health[" in m and "action=reset" in m]  # the machine is shared
    print("\n".join(ours))
    assert any("event=begin" in m and str(site.root) in m for m in ours)
    assert any("event=finish result=ok" in m for m in ours)
    assert all(m.startswith("<29>") for m in ours)  # facility daemon (3), severity notice (5)
