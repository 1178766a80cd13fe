"""Deep checks on a real GPU: the canary through MPS, FAULT from an illegal address.

Run on the H200 as root: ``python3 -m pytest -m gpu tests/gpu/test_deep_gpu.py -v -s``.
Every test prints what it saw (raw control answers, log lines, the checks' output) for
docs/gpu-validation.md. Each test starts its own control daemon on a private pipe dir
under /tmp and quits it afterwards; no GPU setting is changed.

With MPS_HEALTH_GPU_FAKE=1 (no GPU) the same scenarios run against the fake daemon and
the fake canary (tests/fakes), skipping what needs CUDA, so they are known to work
before the one GPU run.
"""

import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from clirun import mps_health
from mpsdaemon import query, quit_daemon, start_daemon
from mpsgpu import pythonpath, real_control
from nodesite import Site
from paths import FAKE_CONTROL, FAKES

pytestmark = pytest.mark.gpu

FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"
OTHER_USER = "mpshealth-gpu-test"


REAL = bool(shutil.which("nvidia-smi")) and real_control() is not None
if not (REAL or FAKE):
    pytest.skip("needs a GPU with the MPS binaries (or MPS_HEALTH_GPU_FAKE=1)",
                allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("runs as root (daemons, another user's client)", allow_module_level=True)


_LINES: Dict[int, queue.Queue] = {}


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout, or "" after ``timeout`` (a hung client never hangs us)."""
    if proc.pid not in _LINES:
        lines: queue.Queue = queue.Queue()
        _LINES[proc.pid] = lines

        def pump() -> None:
            for line in proc.stdout or ():
                lines.put(line)
            lines.put("")

        threading.Thread(target=pump, daemon=True).start()
    try:
        return _LINES[proc.pid].get(timeout=timeout)
    except queue.Empty:
        return ""


def show(title: str, text: str) -> None:
    print(f"\n=== {title}\n{text.rstrip()}", flush=True)


class Node:
    """A private MPS instance: pipe and log dirs, config, a daemon we start and quit."""

    def __init__(self, extra: str = "") -> None:
        self.site = Site.create(prefix="mpsh-deep-")
        self.base = self.site.root
        self.pipe, self.log = self.site.dirs()
        self.control = real_control() if REAL else FAKE_CONTROL
        commands = {"nvidia-cuda-mps-control": self.control}
        if not REAL:
            commands["mps-health-canary"] = str(FAKES / "mps-canary")
        self.config = Path(self.site.config(extra, commands=commands))
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
                        CUDA_MPS_LOG_DIRECTORY=str(self.log))
        if pythonpath():
            self.env["PYTHONPATH"] = pythonpath()
        self.daemon: Optional[int] = None

    def start(self) -> "Node":
        self.daemon = start_daemon(self.pipe, self.log, self.control, env=self.env)
        return self

    def query(self, command: str, timeout: float = 10) -> str:
        r = query(self.pipe, command, self.control, timeout=timeout, env=self.env)
        return f"$ echo {command} | nvidia-cuda-mps-control   (rc {r.returncode})\n" \
               f"{r.stdout}{r.stderr}"

    def answer(self, command: str) -> str:
        return self.query(command).split("\n", 1)[1].strip()

    def check(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return mps_health("check", "--config", str(self.config), *args, timeout=timeout,
                          env=self.env, cwd="/")

    def logs(self) -> str:
        out = []
        for name in ("control.log", "server.log"):
            path = self.log / name
            text = path.read_text(errors="replace") if path.exists() else "(none)\n"
            out.append(f"--- {name} (last 40 lines)\n" + "".join(text.splitlines(True)[-40:]))
        return "".join(out)

    def quit(self) -> None:
        if self.daemon is None:
            return
        quit_daemon(self.pipe, self.daemon, self.control, env=self.env,
                    command="quit -t 5" if REAL else "quit")
        self.daemon = None


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node("canary:\n  timeout_s: 20\n  when: always\n")  # no Slurm here
    yield n.start()
    n.quit()
    n.site.close()


def result(r: subprocess.CompletedProcess, check: str) -> List[Dict]:
    data = json.loads(r.stdout)
    return [x for c in data["checks"] if c["name"] == check for x in c["results"]]


def ps_servers(n: Node) -> str:
    """Each server's pid, parent and user: the servers probe assumes the daemon is parent."""
    lines = []
    for pid in n.answer("get_server_list").split():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            uid = os.stat(f"/proc/{pid}").st_uid
        except (OSError, ValueError):
            lines.append(f"server {pid}: gone")
            continue
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        lines.append(f"server {pid}: ppid {ppid} (daemon {n.daemon}: "
                     f"{'child' if ppid == n.daemon else 'NOT a child'}), uid {uid}, "
                     f"cmdline[0] {argv0!r}")
    return "\n".join(lines) or "(no server)"


# --- 1. a healthy daemon serves the canary ---------------------------------------------------

def test_canary_served_by_a_healthy_daemon(node: Node) -> None:
    # Not the daemon check: other daemons on the machine would be "unexpected" here.
    r = node.check("--only", "control,servers,logs,canary", "-v")
    show("check -v, healthy daemon", r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK canary[node]: a CUDA client (pid " in r.stdout
    assert "served by MPS server " in r.stdout
    show("servers after the canary", node.query("get_server_list") + ps_servers(node))
    for pid in node.answer("get_server_list").split():
        show(f"server {pid}", node.query(f"get_server_status {pid}")
             + node.query(f"get_client_list {pid}"))
    srv = node.check("--only", "servers", "--format", "json")
    listed = node.answer("get_server_list").split()
    show("servers check (json)", json.dumps(result(srv, "servers"), indent=1))
    if listed:  # the idle shortcut must not hide a server that exists
        assert result(srv, "servers")[0]["values"]["servers"] == len(listed)
    latencies, totals, walls = [], [], []
    for _ in range(5):
        t0 = time.monotonic()
        j = node.check("--only", "canary", "--format", "json")
        walls.append(time.monotonic() - t0)
        (res,) = result(j, "canary")
        assert res["state"] == "OK", res
        latencies.append(res["values"]["canary_latency_s"])
        totals.append(res["values"]["canary_total_s"])
    t0 = time.monotonic()
    node.check("--only", "control,directories,servers,logs")
    fast = time.monotonic() - t0
    show("canary cost over 5 runs",
         f"time to first context (s): {', '.join(f'{x:.3f}' for x in latencies)}\n"
         f"canary process, launch to exit (s): {', '.join(f'{x:.3f}' for x in totals)}\n"
         f"'mps-health check --only canary' wall (s): {', '.join(f'{x:.3f}' for x in walls)}\n"
         f"'mps-health check' without the canary, wall (s): {fast:.3f}")
    show("logs after the canary runs", node.logs())


# --- 2. a stopped daemon: the canary fails within its timeout -----------------------------------

def test_canary_fails_with_the_daemon_gone(node: Node) -> None:
    node.query("quit")
    node.daemon = None
    t0 = time.monotonic()
    r = node.check("--only", "control,canary", "-v")
    elapsed = time.monotonic() - t0
    show(f"check after quit ({elapsed:.2f}s)", r.stdout + r.stderr)
    assert r.returncode == 2
    assert "canary-not-served" in r.stdout or "canary-failed" in r.stdout
    assert elapsed < 20 + 10


def test_canary_times_out_on_a_stopped_daemon() -> None:
    n = Node("canary:\n  timeout_s: 5\n  when: always\ncontrol:\n  timeout_s: 1\n").start()
    try:
        assert n.daemon is not None
        os.kill(n.daemon, signal.SIGSTOP)
        t0 = time.monotonic()
        r = n.check("--only", "control,canary", "-v")
        elapsed = time.monotonic() - t0
        os.kill(n.daemon, signal.SIGCONT)
        show(f"check with the daemon SIGSTOPped ({elapsed:.2f}s)", r.stdout + r.stderr)
        assert r.returncode == 2
        assert "canary-timeout" in r.stdout or "canary-failed" in r.stdout
        assert elapsed < 5 + 10
    finally:
        n.quit()
        n.site.close()


# --- 3. another user's client: the canary skips -----------------------------------------

@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    created = False
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/false",
                        OTHER_USER], check=True, timeout=30)
        created = True
    yield pwd.getpwnam(OTHER_USER)
    if created:
        subprocess.run(["userdel", OTHER_USER], timeout=30, check=False)


TORCH_CLIENT = """
import sys, time, torch
x = torch.ones(1024, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _python_for(user: pwd.struct_passwd) -> str:
    # The interpreter running the tests first: on the GPU node it is the one with torch.
    for path in (sys.executable, "/usr/bin/python3"):
        ok = subprocess.run(["runuser", "-u", user.pw_name, "--", path, "-c",
                             "import torch" if REAL else "pass"],
                            capture_output=True, timeout=120).returncode == 0
        if ok:
            return path
    pytest.skip(f"no python3 that {user.pw_name} may run")


def test_canary_skips_behind_another_users_client(node: Node,
                                                  other_user: pwd.struct_passwd) -> None:
    env = dict(node.env, HOME="/tmp")
    if REAL:
        argv = ["runuser", "-u", other_user.pw_name, "--", _python_for(other_user), "-c",
                TORCH_CLIENT, "90"]
    else:
        argv = ["runuser", "-u", other_user.pw_name, "--", "sleep", "90"]
    client = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        if REAL:
            line = read_line(client, 120)
            if line.strip() != "ready":
                os.killpg(client.pid, signal.SIGKILL)
                client.wait(timeout=30)
                err = client.stderr.read() if client.stderr else ""
                show("the other user's torch client failed", line + err)
                pytest.fail("the other user's client did not start: see its output above")
        else:
            time.sleep(0.3)
            child = subprocess.run(["pgrep", "-P", str(client.pid)], capture_output=True,
                                   text=True).stdout.split()
            pid = child[0] if child else str(client.pid)
            node.query(f"fake_client_connect {pid} {other_user.pw_uid}")
        show("the other user's client is connected", node.query("get_server_list")
             + ps_servers(node) + "\n" + "\n".join(
                 node.query(f"get_client_list {p}") for p in node.answer(
                     "get_server_list").split()))
        r = node.check("--only", "servers,canary", "-v")
        show("check with another user's client connected", r.stdout + r.stderr)
        # An OK finding with a code of its own is a NOTE (not counted, said).
        assert "NOTE canary[node]: canary not run: 1 client(s) of another user are connected " \
               "(e.g. " in r.stdout
        assert f"{other_user.pw_name}, on server" in r.stdout
        assert "the canary would queue behind them" in r.stdout
    finally:
        try:
            os.killpg(client.pid, signal.SIGKILL)  # the process group we started
        except ProcessLookupError:
            pass
        client.wait(timeout=30)
        show("logs", node.logs())
        node.quit()  # its server runs as the other user: gone before the user is removed


# --- 4. an illegal memory access: does the server go to FAULT? --------------------------

BAD_KERNEL_CLIENT = r"""
import ctypes, sys, time
PTX = b'''
.version 7.0
.target sm_70
.address_size 64
.visible .entry bad(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 42;
    st.global.u32 [%rd1], %r1;
    ret;
}
''' + b'\0'
cu = ctypes.CDLL("libcuda.so.1")
def name(rc):
    s = ctypes.c_char_p(); cu.cuGetErrorName(rc, ctypes.byref(s)); return s.value
def step(what, rc):
    print(what, rc, name(rc) if rc else "", flush=True); return rc
dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
step("cuInit", cu.cuInit(0)); step("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
step("cuCtxCreate", cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
step("cuModuleLoadData", cu.cuModuleLoadData(ctypes.byref(mod), PTX))
step("cuModuleGetFunction", cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"bad"))
bad = ctypes.c_uint64(0x10)
params = (ctypes.c_void_p * 1)(ctypes.addressof(bad))
step("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None))
step("cuCtxSynchronize", cu.cuCtxSynchronize())
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_illegal_address_and_fault(node: Node) -> None:
    if REAL:
        client = subprocess.Popen([sys.executable, "-c", BAD_KERNEL_CLIENT, "60"], env=node.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        said = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = read_line(client, max(0.1, deadline - time.monotonic()))
            if not line:
                break
            said.append(line)
            if line.startswith("holding"):
                break
        show("the bad-kernel client said", "".join(said))
    else:
        client = subprocess.Popen(["sleep", "60"], start_new_session=True)
        server = node.answer(f"fake_client_connect {client.pid}")
        node.query(f"fake_server_set {server} FAULT")
    try:
        time.sleep(1.0)
        raw = node.query("get_server_list")
        for pid in node.answer("get_server_list").split():
            raw += node.query(f"get_server_status {pid}") + node.query(f"get_client_list {pid}")
        show("control answers while the faulting client lives", raw + ps_servers(node))
        r = node.check("--only", "servers,logs,canary", "-v")
        show("checks while the faulting client lives", r.stdout + r.stderr)
        statuses = [node.answer(f"get_server_status {p}")
                    for p in node.answer("get_server_list").split()]
        if "FAULT" in statuses:
            assert "server-fault" in r.stdout
            assert "mps-health remediate reset node" in r.stdout
    finally:
        os.killpg(client.pid, signal.SIGKILL)  # the process group we started
        client.wait(timeout=30)
    time.sleep(2.0)
    raw = node.query("get_server_list")
    for pid in node.answer("get_server_list").split():
        raw += node.query(f"get_server_status {pid}") + node.query(f"get_client_list {pid}")
    show("control answers after the faulting client exited", raw)
    r = node.check("--only", "servers,logs,canary", "-v")
    show("checks after the faulting client exited", r.stdout + r.stderr)
    show("logs", node.logs())
