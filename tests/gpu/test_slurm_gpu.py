"""The per-job hooks on a real GPU, without Slurm: called as slurmd would call them.

The GPU node has no Slurm, so the installed Prolog, TaskProlog and Epilog get the
environment slurmd 22.05 was seen to give them (tests/fixtures/slurm_hook_env__*):
SLURM_JOB_ID/UID/GID/USER, CUDA_VISIBLE_DEVICES=0, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50.
The job user is an ordinary user made with useradd. Then a torch client runs as that
user through the job's daemon (confirmed with get_client_list), and the Epilog must
leave no process and no dir, after a normal end and after a "scancel" (client killed).

Run on the GPU node: python3 -m pytest -m gpu tests/gpu -v -s
With MPS_HEALTH_GPU_FAKE=1 it runs against tests/fakes' fake (torch parts skipped).
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
from clirun import mps_health
from jobhooks import FAKE_CONTROL, JobHooks, as_user_kwargs, daemon_pid, proc_uid
from mpsgpu import USE_FAKE, env_info, have_torch_cuda, real_control, say
from paths import FIXTURES
from slurmcluster import ensure_user

pytestmark = pytest.mark.gpu

TORCH_CLIENT = """
import os, sys, time, torch
x = torch.ones(2048, 2048, device="cuda")
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
print("done", flush=True)
"""


@pytest.fixture
def hooks() -> Iterator[JobHooks]:
    if os.geteuid() != 0:
        pytest.skip("needs root (the prolog chowns and starts the daemon as the job user)")
    user = ensure_user().pw_name
    control = FAKE_CONTROL if USE_FAKE else real_control()
    assert control is not None
    s = JobHooks(user, sys.executable, control=control)
    say(f"== per-job hooks on {env_info().get('gpu', 'the fake')}; job user {user} "
        f"(uid {s.pw.pw_uid}); control {control}", s.install_output.rstrip())
    yield s
    s.close()


def user_can_import(user: str, module: str) -> bool:
    """Can ``user`` run this Python and import ``module`` (the repo may be root's only)?"""
    try:
        r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
                           **as_user_kwargs(user))
    except OSError:
        return False
    return r.returncode == 0


def control(hooks: JobHooks, pipe: Path, command: str) -> str:
    """A control query through the job's daemon, as the job's user."""
    binary = FAKE_CONTROL if USE_FAKE else real_control()
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    r = subprocess.run([str(binary)], input=command + "\n", env=env, capture_output=True,
                       text=True, timeout=30, **as_user_kwargs(hooks.user))
    say(f"  {command} -> rc {r.returncode} {r.stdout.strip()!r}")
    return r.stdout


def mps_processes() -> List[str]:
    out = subprocess.run(["ps", "-eo", "pid,ppid,user,stat,args"], capture_output=True,
                         text=True, timeout=30).stdout.splitlines()
    return [line for line in out[1:] if "nvidia-cuda-mps" in line and "<defunct>" not in line]


def run_prolog(hooks: JobHooks, job: str) -> Path:
    r = hooks.run("prolog", hooks.env("prolog", job))
    say(f"--- Prolog job {job}: rc {r.returncode}", *("    " + x for x in r.stderr.splitlines()))
    assert r.returncode == 0, r.stderr
    pipe = hooks.pipe_dir(job)
    pid = daemon_pid(pipe)
    assert pid is not None
    say(f"daemon {pid} runs as uid {proc_uid(pid)}",
        *("    " + x for x in subprocess.run(["ls", "-la", str(pipe)], capture_output=True,
                                              text=True).stdout.splitlines()))
    assert proc_uid(pid) == hooks.pw.pw_uid
    return pipe


def task_exports(hooks: JobHooks, job: str) -> List[str]:
    env = hooks.env("task-prolog", job)
    if user_can_import(hooks.user, "mps_health.slurm.hooks"):
        t = hooks.run("task-prolog", env, as_user=True)
        assert t.returncode == 0, t.stderr
        lines = t.stdout.splitlines()
        say(f"--- TaskProlog as {hooks.user}:", *("    " + x for x in lines))
    else:
        from mps_health.config.load import load
        from mps_health.slurm.lifecycle import task_exports as exports

        lines = exports(env, load(str(hooks.config), table=None), hooks.pw.pw_uid)
        say(f"--- TaskProlog lines (computed as root: {hooks.user} cannot import "
            f"mps_health with {sys.executable}):", *("    " + x for x in lines))
    return lines


def start_client(hooks: JobHooks, exports: List[str], seconds: float) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "CUDA_VISIBLE_DEVICES": "0",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    for line in exports:
        key, _, value = line[len("export "):].partition("=")
        env[key] = value
    return subprocess.Popen([sys.executable, "-c", TORCH_CLIENT, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, **as_user_kwargs(hooks.user))


def clients_through_daemon(hooks: JobHooks, pipe: Path, client_pid: int) -> Optional[str]:
    servers = control(hooks, pipe, "get_server_list").split()
    for server in servers:
        if str(client_pid) in control(hooks, pipe, f"get_client_list {server}").split():
            return server
    return None


def run_epilog(hooks: JobHooks, job: str) -> None:
    t0 = time.monotonic()
    e = hooks.run("epilog", hooks.env("epilog", job))
    say(f"--- Epilog job {job}: rc {e.returncode} in {time.monotonic() - t0:.2f}s",
        *("    " + x for x in e.stderr.splitlines()))
    assert e.returncode == 0, e.stderr
    left = mps_processes()
    say(f"after the epilog: parent dir {hooks.entries() or 'empty'}; MPS processes "
        f"{left or 'none'}")
    assert hooks.entries() == [] and hooks.processes() == []
    assert not [x for x in left if f" {hooks.user} " in f" {x} "]


def can_use_torch(hooks: JobHooks) -> bool:
    if USE_FAKE or not have_torch_cuda():
        say("(no torch with CUDA here: client part skipped)")
        return False
    if not user_can_import(hooks.user, "torch"):
        say(f"(SKIPPED client part: {hooks.user} cannot import torch with {sys.executable}; "
            "run this with a python3 that other users can execute)")
        return False
    return True


def test_job_life_cycle_with_a_torch_client(hooks: JobHooks) -> None:
    job = str(random.randint(900000, 999999))
    pipe = run_prolog(hooks, job)
    exports = task_exports(hooks, job)
    assert exports[0] == f"export CUDA_MPS_PIPE_DIRECTORY={pipe}"
    control(hooks, pipe, "get_default_active_thread_percentage")
    if can_use_torch(hooks):
        client = start_client(hooks, exports, 8)
        assert client.stdout is not None
        line = client.stdout.readline().strip()
        say(f"torch client as {hooks.user}: {line!r}")
        assert line.startswith("ready"), client.stderr.read() if client.stderr else ""
        server = clients_through_daemon(hooks, pipe, client.pid)
        assert server is not None, "the client is not in the daemon's get_client_list"
        say(f"client {client.pid} is served by MPS server {server} (uid {proc_uid(int(server))})")
        assert proc_uid(int(server)) == hooks.pw.pw_uid
        # tmpfiles judges the node's /tmp aging rules, not this job: skipped here.
        check = mps_health("check", "--config", str(hooks.config), "--skip", "tmpfiles")
        say(f"mps-health check during the job: exit {check.returncode}",
            *("    " + x for x in check.stdout.splitlines()))
        assert check.returncode == 0
        out, err = client.communicate(timeout=120)
        say(f"torch client ended: rc {client.returncode} {out.strip()!r} {err.strip()[-300:]!r}")
        assert client.returncode == 0
    log = hooks.parent / f"nvidia-log_job{job}" / "control.log"
    if log.exists():
        say("control.log:", *("    " + x for x in log.read_text().splitlines()[-15:]))
    run_epilog(hooks, job)


def test_cancelled_job_leaves_nothing(hooks: JobHooks) -> None:
    job = str(random.randint(900000, 999999))
    pipe = run_prolog(hooks, job)
    exports = task_exports(hooks, job)
    if can_use_torch(hooks):
        client = start_client(hooks, exports, 300)
        assert client.stdout is not None and client.stdout.readline().startswith("ready")
        server = clients_through_daemon(hooks, pipe, client.pid)
        say(f"busy client {client.pid} on server {server}; killing it as scancel does")
        os.killpg(client.pid, signal.SIGKILL)  # the client we started, by its PID
        client.wait(30)
    run_epilog(hooks, job)


def test_gres_conf_and_slurm_conf_from_live_nvml() -> None:
    """On the GPU node: the lines come from the real NVML (the fake run uses the H200 dump)."""
    record = [] if not USE_FAKE else [
        "--nvml-record", str(FIXTURES / "nvml_dump__h200-driver580.json")]
    g = mps_health("slurm", "gres-conf", *record)
    say(f"--- mps-health slurm gres-conf: exit {g.returncode} {g.stderr.strip()}",
        *("    " + x for x in g.stdout.splitlines()))
    assert g.returncode == 0
    lines = [x for x in g.stdout.splitlines() if x and not x.startswith("#")]
    assert lines[:2] == ["Name=gpu File=/dev/nvidia0", "Name=mps Count=100 File=/dev/nvidia0"]
    for line in lines:
        device = line.split("File=", 1)[1]
        assert USE_FAKE or os.path.exists(device), f"{device} does not exist"
    c = mps_health("slurm", "conf", *record)
    say(f"--- mps-health slurm conf: exit {c.returncode} {c.stderr.strip()}",
        *("    " + x for x in c.stdout.splitlines()))
    assert c.returncode == 0 and "GresTypes=gpu,mps" in c.stdout
