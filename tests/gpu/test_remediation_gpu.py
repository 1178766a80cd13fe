"""``mps-health remediate reset`` on a real GPU: each fault repaired, timed; clients refused.

Run on the GPU node as root: ``python3 -m pytest -m gpu tests/gpu -v -s`` (after
``python3 -m pip install --no-deps --no-build-isolation -e .``). Every daemon runs on a
private pipe dir under /tmp/mpsh-gpu-*, never /tmp/nvidia-mps, and is quit at the end;
no GPU setting is changed. With MPS_HEALTH_GPU_FAKE=1 the same tests run on CPU against
tests/fakes/nvidia-cuda-mps-control (the torch client test is skipped there).

Each test prints what it saw (check and reset outputs, timings) for docs/gpu-validation.md.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional

import pytest
from clirun import mps_health
from mpsdaemon import query, quit_daemon, start_daemon
from nodesite import Site
from paths import FAKE_CONTROL

pytestmark = pytest.mark.gpu

USE_FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"


def real_control() -> Optional[str]:
    found = shutil.which("nvidia-cuda-mps-control")
    if found and os.path.realpath(found) != os.path.realpath(FAKE_CONTROL) \
            and shutil.which("nvidia-smi"):
        return found
    return None


CONTROL = FAKE_CONTROL if USE_FAKE else real_control()
if CONTROL is None:
    pytest.skip("needs a GPU with the MPS binaries (or MPS_HEALTH_GPU_FAKE=1 on CPU)",
                allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("run as root: reset ends daemons and repairs dirs", allow_module_level=True)
try:
    from mps_health import remediation  # noqa: F401
except ImportError:
    pytest.fail("mps_health is not installed: python3 -m pip install --no-deps "
                "--no-build-isolation -e .", pytrace=False)


class Inst(NamedTuple):
    base: Path
    pipe: Path
    log: Path
    cfg: str


TIMINGS: List[str] = []


@pytest.fixture(scope="module", autouse=True)
def print_timings() -> Iterator[None]:
    """The summary for docs/gpu-validation.md, printed after the module's tests."""
    yield
    print("\nfault-to-healthy timings (" + ("fake daemon" if USE_FAKE else "real MPS") + "):")
    for line in TIMINGS:
        print("  " + line)


def control(inst: Inst, command: str, timeout: float = 10) -> str:
    assert CONTROL is not None
    return query(inst.pipe, command, CONTROL, timeout=timeout,
                 env={"CUDA_MPS_LOG_DIRECTORY": str(inst.log)}).stdout


def daemon_pid(inst: Inst) -> Optional[int]:
    """The live control daemon whose environ names this pipe dir (root reads environ)."""
    from mps_health.probes.proc import read_processes

    for p in read_processes("/proc"):
        if p.role == "control" and p.pipe_dir == str(inst.pipe) and p.state not in ("Z", "X"):
            return p.pid
    return None


def problems(inst: Inst) -> List[str]:
    r = mps_health("check", "--config", inst.cfg, "--only", "daemon,control,directories",
                   "--format", "json", timeout=120)
    found = [p for p in json.loads(r.stdout)["problems"] if p["instance"] == "node"]
    for p in found:
        print(f"  check: {p['state']} {p['code']}: {p['message']}")
    return [p["code"] for p in found]


@pytest.fixture
def inst() -> Iterator[Inst]:
    site = Site.create(prefix="mpsh-gpu-")
    base = site.root
    pipe, log = site.dirs()
    cfg = site.config(commands={"nvidia-cuda-mps-control": CONTROL},
                      remediation={"audit_log": f"{base}/audit.log", "syslog": False,
                                   "quit_timeout_s": 5, "term_timeout_s": 5})
    i = Inst(base, pipe, log, cfg)
    assert CONTROL is not None
    start_daemon(pipe, log, CONTROL)
    deadline = time.monotonic() + 15
    while control(i, "get_default_active_thread_percentage").strip() == "" and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield i
    finally:
        pid = daemon_pid(i)
        if pid is not None:  # by the PID we verified, never by name
            quit_daemon(i.pipe, pid, CONTROL, grace=0.5)
        site.close()


def repair_and_time(inst: Inst, fault: str, t_fault: float) -> None:
    found = problems(inst)
    print(f"fault {fault}: the check finds {found}")
    assert found, f"{fault}: the check saw nothing wrong"
    t0 = time.monotonic()
    r = mps_health("remediate", "reset", "--config", inst.cfg, timeout=120, show=True)
    reset_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert problems(inst) == [], f"{fault}: still unhealthy after reset"
    total = time.monotonic() - t_fault
    line = f"{fault:<24} found {','.join(found):<40} reset {reset_s:5.2f}s  fault-to-healthy " \
           f"{total:5.2f}s"
    TIMINGS.append(line)
    print("TIMING " + line)


def test_stale_dir_after_sigkill(inst: Inst) -> None:
    pid = daemon_pid(inst)
    assert pid is not None
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    print("pipe dir after SIGKILL:", sorted(os.listdir(inst.pipe)))
    repair_and_time(inst, "stale dir (SIGKILL)", t)


def test_wedged_daemon_sigstop(inst: Inst) -> None:
    pid = daemon_pid(inst)
    assert pid is not None
    t = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    repair_and_time(inst, "wedged daemon (SIGSTOP)", t)
    # The reset continues it first (SIGCONT keeps its servers' jobs): no restart needed.
    assert daemon_pid(inst) == pid


def test_wrong_mode_0700(inst: Inst) -> None:
    t = time.monotonic()
    inst.pipe.chmod(0o700)
    repair_and_time(inst, "pipe dir mode 0700", t)
    assert stat.S_IMODE(os.lstat(inst.pipe).st_mode) == 0o777


def test_symlinked_pipe_dir(inst: Inst) -> None:
    pid = daemon_pid(inst)
    control(inst, "quit", timeout=15)
    sensitive = inst.base / "sensitive"
    sensitive.mkdir(mode=0o700)
    (sensitive / "data").write_text("do not touch\n")
    before = sorted(os.listdir(sensitive)), stat.S_IMODE(os.lstat(sensitive).st_mode)
    shutil.rmtree(inst.pipe)
    t = time.monotonic()
    inst.pipe.symlink_to(sensitive)
    repair_and_time(inst, "symlinked pipe dir", t)
    assert (sorted(os.listdir(sensitive)), stat.S_IMODE(os.lstat(sensitive).st_mode)) == before
    assert not inst.pipe.is_symlink() and daemon_pid(inst) not in (None, pid)


TORCH_CLIENT = r"""
import os, sys, time
import torch
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    x = x * 1.0001
    torch.cuda.synchronize()
    time.sleep(0.05)
"""

TORCH_ONCE = r"""
import torch
x = torch.ones(1 << 20, device="cuda") * 2
torch.cuda.synchronize()
print("sum", float(x.sum()))
"""


@pytest.mark.skipif(USE_FAKE, reason="needs CUDA and torch")
def test_a_torch_client_makes_reset_refuse_and_force_loses_only_it(inst: Inst) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(inst.pipe),
               CUDA_MPS_LOG_DIRECTORY=str(inst.log))
    ready = inst.base / "client.ready"
    client = subprocess.Popen([sys.executable, "-c", TORCH_CLIENT, str(ready)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and client.poll() is None:
            time.sleep(0.2)
        assert ready.exists(), "the torch client did not start: " + (client.stderr.read()
                                                                     if client.poll() is not None
                                                                     else "timeout")
        servers = control(inst, "get_server_list").split()
        clients = [c for s in servers for c in control(inst, f"get_client_list {s}").split()]
        print(f"servers {servers}, clients {clients}, torch pid {client.pid}")
        assert str(client.pid) in clients, "the torch client is not an MPS client"
        old_daemon = daemon_pid(inst)
        # A dir fault alone is put right around the running daemon: the client keeps
        # its server, the daemon stays, and a reset plans the same, no restart.
        inst.pipe.chmod(0o700)
        fixed = mps_health("remediate", "dirs", "--config", inst.cfg, timeout=120, show=True)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert stat.S_IMODE(os.lstat(inst.pipe).st_mode) == 0o777
        assert client.poll() is None and daemon_pid(inst) == old_daemon
        assert str(client.pid) in [c for s in control(inst, "get_server_list").split()
                                   for c in control(inst, f"get_client_list {s}").split()]
        # Something only a restart repairs: the daemon's pid file made a FIFO
        # (pipe-entry-bad); the client makes a reset refuse.
        os.unlink(inst.pipe / "nvidia-cuda-mps-control.pid")
        os.mkfifo(inst.pipe / "nvidia-cuda-mps-control.pid")
        refused = mps_health("remediate", "reset", "--config", inst.cfg, timeout=120, show=True)
        assert refused.returncode == 1
        assert f"client(s) connected: {client.pid}" in refused.stdout
        assert client.poll() is None, "a refused reset must not touch the client"
        assert daemon_pid(inst) == old_daemon
        t0 = time.monotonic()
        forced = mps_health("remediate", "reset", "--config", inst.cfg, "--force", timeout=120,
                            show=True)
        print(f"forced reset took {time.monotonic() - t0:.2f}s")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        try:
            rc = client.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        err = client.stderr.read() if rc is not None else ""
        print(f"torch client after the forced reset: exit {rc}; stderr tail: {err[-600:]}")
        assert rc not in (None, 0), "the client should have lost its MPS server"
        assert problems(inst) == []
        assert daemon_pid(inst) not in (None, old_daemon)
        again = subprocess.run([sys.executable, "-c", TORCH_ONCE], env=env, capture_output=True,
                               text=True, timeout=120)
        print("a new client through the new daemon:", again.returncode, again.stdout.strip(),
              again.stderr.strip()[-300:])
        assert again.returncode == 0 and "sum" in again.stdout
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
