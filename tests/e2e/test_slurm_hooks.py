"""The installed Prolog, TaskProlog and Epilog, run as slurmd runs them, with the fake daemon.

Each test gets its hooks on a private site (tests/helpers/jobhooks.py): a sticky parent dir for
/tmp, a per-job config, hooks written by ``mps-health slurm install``. The hooks get
the environment real slurmd 22.05 gave them (tests/fixtures/slurm_hook_env__*); the
TaskProlog runs as the test user. The real-Slurm version is tests/real/test_slurm_jobs.py.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from clirun import mps_health, report
from conftest import FAKE_SERVER
from jobhooks import JobHooks, as_user_kwargs, daemon_pid, proc_uid, user_python
from mpsdaemon import stop_process
from slurmcluster import ensure_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root (the prolog chowns and drops to the user)")


@pytest.fixture(scope="module")
def user() -> str:
    return ensure_user().pw_name


@pytest.fixture(scope="module")
def python(user: str) -> Iterator[str]:
    # Not under pytest's tmp dirs: every pytest session on the machine makes those 0700.
    base = Path(tempfile.mkdtemp(prefix="mpsh-userpy-", dir="/tmp"))
    base.chmod(0o755)
    try:
        found = user_python(base, user)
        if found is None:
            pytest.skip(f"no Python that {user} can run imports this checkout's mps_health")
        yield found
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def make_hooks(user: str, python: str) -> Iterator:
    sites = []

    def make(**kw) -> JobHooks:
        s = JobHooks(user, python, **kw)
        sites.append(s)
        return s

    yield make
    for s in sites:
        s.close()


def test_the_hooks_record_each_step_before_acting(make_hooks) -> None:
    """Prolog: "prolog start" before the dirs, "prolog" once the daemon answers; Epilog:
    "epilog" before the quit. The health check leaves the instance alone meanwhile."""
    from mps_health.hostio import planned

    hooks = make_hooks()
    assert hooks.run("prolog", hooks.env("prolog", "43")).returncode == 0
    assert hooks.run("epilog", hooks.env("epilog", "43")).returncode == 0
    records, error = planned.load(str(hooks.site.state_dir))
    assert error == ""
    assert [r.by for r in records if r.pipe_dir == str(hooks.pipe_dir("43"))] == [
        "prolog start", "prolog", "epilog"]
    assert hooks.entries() == []


def environ_of(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def check(hooks: JobHooks) -> dict:
    # tmpfiles judges the machine's /tmp aging rules, not these dirs: skipped here.
    r = mps_health("check", "--config", str(hooks.config), "--skip", "tmpfiles",
                   "--format", "json")
    assert r.returncode in (0, 1, 2), r.stderr
    return report(r)


def test_mps_job_life_cycle(make_hooks) -> None:
    hooks = make_hooks()
    r = hooks.run("prolog", hooks.env("prolog", "41"))
    assert r.returncode == 0, r.stderr
    pipe, log = hooks.pipe_dir("41"), hooks.parent / "nvidia-log_job41"
    for d in (pipe, log):
        st = os.lstat(d)
        assert (st.st_uid, st.st_mode & 0o7777) == (hooks.pw.pw_uid, 0o700)
    pid = daemon_pid(pipe)
    assert pid is not None and proc_uid(pid) == hooks.pw.pw_uid  # the job's user, not root
    env = environ_of(pid)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert f"started MPS daemon {pid} as {hooks.user} for GPUs 0 in {pipe}" in r.stderr

    t = hooks.run("task-prolog", hooks.env("task-prolog", "41"), as_user=True)
    assert (t.returncode, t.stderr) == (0, "")
    assert t.stdout.splitlines() == [f"export CUDA_MPS_PIPE_DIRECTORY={pipe}",
                                     f"export CUDA_MPS_LOG_DIRECTORY={log}"]
    hooks.slurm_runs("41")
    report = check(hooks)
    assert report["exit_code"] == 0, report["problems"]
    daemon = [r for run in report["checks"] if run["name"] == "daemon" for r in run["results"]]
    assert [d["instance"] for d in daemon] == ["job41"]

    e = hooks.run("epilog", hooks.env("epilog", "41"))
    assert e.returncode == 0, e.stderr
    assert "cleaned up MPS for the job (1 process(es)" in e.stderr
    assert hooks.entries() == [] and hooks.processes() == []
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    daemon = [r for run in check(hooks)["checks"] if run["name"] == "daemon"
              for r in run["results"]]
    assert [d["message"] for d in daemon] == [
        "no MPS instance on this node (per-job layout, no job)"]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_jobs_without_gpus_read_no_config(make_hooks) -> None:
    hooks = make_hooks()
    hooks.config.write_text("mps: [not, a, mapping\n")  # any read of it would fail loudly
    for hook in ("prolog", "epilog"):
        r = hooks.run(hook, hooks.env(hook, "42", label="no-gres"))
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    t = hooks.run("task-prolog", hooks.env("task-prolog", "42", label="no-gres"), as_user=True)
    assert (t.returncode, t.stdout, t.stderr) == (0, "", "")
    assert hooks.entries() == []


def test_whole_gpu_jobs_get_a_daemon_only_when_configured(make_hooks) -> None:
    hooks = make_hooks()
    r = hooks.run("prolog", hooks.env("prolog", "43", label="gpu-1"))
    assert (r.returncode, r.stderr) == (0, "") and hooks.entries() == []
    every = make_hooks(jobs={"start_for": "gpu"})
    r = every.run("prolog", every.env("prolog", "43", label="gpu-1"))
    assert r.returncode == 0, r.stderr
    pid = daemon_pid(every.pipe_dir("43"))
    assert pid is not None and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in environ_of(pid)
    assert every.run("epilog", every.env("epilog", "43", label="gpu-1")).returncode == 0
    assert every.entries() == [] and every.processes() == []


def test_planted_symlink_is_moved_aside_and_the_job_still_runs(make_hooks,
                                                                tmp_path: Path) -> None:
    hooks = make_hooks()
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    planted = hooks.pipe_dir("44")
    planted.symlink_to(victim)
    os.lchown(planted, hooks.pw.pw_uid + 1, hooks.pw.pw_gid)  # another user's link
    r = hooks.run("prolog", hooks.env("prolog", "44"))
    assert r.returncode == 0, r.stderr
    assert f"{planted} was a symlink owned by uid {hooks.pw.pw_uid + 1}" in r.stderr
    assert os.lstat(victim).st_uid == 0 and os.listdir(victim) == []  # never followed
    assert planted.is_dir() and not planted.is_symlink()
    assert daemon_pid(planted) is not None
    assert hooks.run("epilog", hooks.env("epilog", "44")).returncode == 0
    [aside] = hooks.entries()  # the evidence stays for the admin; the job's dirs are gone
    assert aside.startswith("nvidia-mps_job44.aside-") and os.listdir(victim) == []


@pytest.mark.parametrize("policy, rc", [("fail", 1), ("continue", 0)])
def test_a_daemon_that_does_not_start(make_hooks, policy: str, rc: int) -> None:
    hooks = make_hooks(control="/bin/true",
                       jobs={"on_start_failure": policy, "start_timeout_s": 1})
    r = hooks.run("prolog", hooks.env("prolog", "45"))
    assert r.returncode == rc, r.stderr
    assert "MPS daemon for GPUs 0 did not start: no daemon in" in r.stderr
    assert hooks.entries() == [] and hooks.processes() == []  # what it made is undone


def test_a_missing_control_binary_is_named(make_hooks) -> None:
    hooks = make_hooks(control="/nonexistent/nvidia-cuda-mps-control")
    r = hooks.run("prolog", hooks.env("prolog", "46"))
    assert r.returncode == 1
    assert "/nonexistent/nvidia-cuda-mps-control: command not found" in r.stderr
    assert hooks.entries() == []


def test_epilog_ends_a_stopped_daemon_and_its_stuck_server(make_hooks) -> None:
    hooks = make_hooks()
    assert hooks.run("prolog", hooks.env("prolog", "47")).returncode == 0
    pipe = hooks.pipe_dir("47")
    pid = daemon_pid(pipe)
    assert pid is not None
    server = subprocess.Popen(
        [FAKE_SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
             "FAKE_MPS_IGNORE_TERM": "1"}, **as_user_kwargs(hooks.user))
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    stop_process(pid)  # a wedged daemon: a quit would hang
    t0 = time.monotonic()
    e = hooks.run("epilog", hooks.env("epilog", "47"))
    took = time.monotonic() - t0
    assert e.returncode == 0, e.stderr
    assert f"daemon {pid} is in state T: not asking it to quit" in e.stderr
    assert f"ended leftover MPS processes by verified PID: control {pid}, server " \
           f"{server.pid}" in e.stderr
    assert server.wait(5) == -signal.SIGKILL  # it ignored SIGTERM
    assert hooks.entries() == [] and hooks.processes() == []
    assert took < 10, f"epilog took {took:.1f}s"


def test_epilog_when_the_user_swapped_the_dir_for_a_symlink(make_hooks, tmp_path: Path) -> None:
    hooks = make_hooks()
    assert hooks.run("prolog", hooks.env("prolog", "48")).returncode == 0
    pipe = hooks.pipe_dir("48")
    pid = daemon_pid(pipe)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("root's")
    moved = hooks.parent / "users-own-name"
    pipe.rename(moved)  # the dir's owner may rename it in a sticky dir
    pipe.symlink_to(victim)
    os.lchown(pipe, hooks.pw.pw_uid, hooks.pw.pw_gid)
    e = hooks.run("epilog", hooks.env("epilog", "48"))
    assert e.returncode == 0, e.stderr
    assert (victim / "keep").read_text() == "root's"
    assert not os.path.lexists(pipe) and hooks.processes() == []
    assert pid is not None and (not os.path.exists(f"/proc/{pid}") or _zombie(pid))


def test_one_daemon_per_gpu(make_hooks) -> None:
    hooks = make_hooks(pipe="mps_job{job}_gpu{gpu}", log="mpslog_job{job}_gpu{gpu}")
    env = hooks.env("prolog", "49", label="gpu-1", CUDA_VISIBLE_DEVICES="0,1",
                   SLURM_JOB_GPUS="0,1", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")
    r = hooks.run("prolog", env)
    assert r.returncode == 0, r.stderr
    pids = [daemon_pid(hooks.pipe_dir("49", g)) for g in ("0", "1")]
    assert None not in pids and len(set(pids)) == 2
    assert [environ_of(p)["CUDA_VISIBLE_DEVICES"] for p in pids if p] == ["0", "1"]
    task = hooks.env("task-prolog", "49", SLURM_STEP_GPUS="1", CUDA_VISIBLE_DEVICES="1")
    t = hooks.run("task-prolog", task, as_user=True)
    assert t.stdout.splitlines()[0] == f"export CUDA_MPS_PIPE_DIRECTORY={hooks.pipe_dir('49', '1')}"
    both = hooks.env("task-prolog", "49", SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1")
    assert hooks.run("task-prolog", both, as_user=True).stdout == ""
    e = hooks.run("epilog", hooks.env("epilog", "49", label="gpu-1", SLURM_JOB_GPUS="0,1",
                                    CUDA_VISIBLE_DEVICES="0,1"))
    assert e.returncode == 0 and "2 process(es)" in e.stderr
    assert hooks.entries() == [] and hooks.processes() == []


def test_task_prolog_exports_only_the_users_own_real_dir(make_hooks) -> None:
    hooks = make_hooks()
    pipe = hooks.pipe_dir("50")
    pipe.mkdir(mode=0o700)  # root's, not the job user's
    t = hooks.run("task-prolog", hooks.env("task-prolog", "50"), as_user=True)
    assert (t.returncode, t.stdout) == (0, "")
    pipe.rmdir()
    other = hooks.parent / "elsewhere"
    other.mkdir(mode=0o700)
    os.chown(other, hooks.pw.pw_uid, hooks.pw.pw_gid)
    pipe.symlink_to(other)  # the user's own dir, but through a link: not exported
    t = hooks.run("task-prolog", hooks.env("task-prolog", "50"), as_user=True)
    assert (t.returncode, t.stdout) == (0, "")


def test_a_second_prolog_keeps_the_running_daemon(make_hooks) -> None:
    hooks = make_hooks()
    assert hooks.run("prolog", hooks.env("prolog", "51")).returncode == 0
    first = daemon_pid(hooks.pipe_dir("51"))
    r = hooks.run("prolog", hooks.env("prolog", "51"))
    assert r.returncode == 0, r.stderr
    assert daemon_pid(hooks.pipe_dir("51")) == first and len(hooks.processes()) == 1
    assert hooks.run("epilog", hooks.env("epilog", "51")).returncode == 0
    assert hooks.entries() == []


def test_a_broken_config_fails_the_prolog_of_an_mps_job_only(make_hooks) -> None:
    hooks = make_hooks()
    hooks.config.write_text("jobs:\n  start_for: sometimes\n")
    r = hooks.run("prolog", hooks.env("prolog", "52"))
    assert r.returncode == 1
    assert "key 'jobs.start_for': must be one of mps, gpu (got 'sometimes')" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert hooks.run("prolog", hooks.env("prolog", "52", label="gpu-1")).returncode == 0
    assert hooks.run("epilog", hooks.env("epilog", "52")).returncode == 0


def test_the_prolog_keeps_the_daemons_logs_its_own(make_hooks) -> None:
    """A link the job's user left as control.log in their reused log dir is removed (its
    target untouched) before their daemon starts, and the dir is made 0700 again."""
    hooks = make_hooks()
    log = hooks.parent / "nvidia-log_job44"
    target = hooks.base / "root-file"
    target.write_text("root's\n")
    for argv in (["mkdir", "-m", "0777", str(log)],
                 ["ln", "-s", str(target), str(log / "control.log")]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                           **as_user_kwargs(hooks.user))
        assert r.returncode == 0, r.stderr
    r = hooks.run("prolog", hooks.env("prolog", "44"))
    assert r.returncode == 0, r.stderr
    assert f"{log}/control.log was a symlink owned by uid {hooks.pw.pw_uid}" in r.stderr
    assert "removed the link (its target untouched)" in r.stderr
    st = os.lstat(log)
    assert (st.st_uid, st.st_mode & 0o7777) == (hooks.pw.pw_uid, 0o700)
    assert target.read_text() == "root's\n"
    assert not (log / "control.log").is_symlink()
    assert hooks.run("epilog", hooks.env("epilog", "44")).returncode == 0
