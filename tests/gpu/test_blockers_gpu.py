"""A local user holds the real control daemon; mps-health names them and frees it in place.

On the H200 with the real binaries, an unprivileged uid (65534) does what any user of a
shared node can: holds an idle (or half) connection to the 0666 control socket, runs the
genuine server binary on the pipe dir and stops it, or stops its own job's MPS server.
Each time ``mps-health check`` names the blocker (pid, uid), ``mps-health remediate
unblock`` and the health check's own run free the daemon, and a legitimate client (a
torch process) is still served, the same one going on. A stopped client blocks nothing;
a stopped daemon's action is ``kill -CONT``.

Run on the GPU node as root: ``python3 -m pytest -m gpu tests/gpu/test_blockers_gpu.py -v -s``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator, List, Optional, Tuple

import pytest
from clirun import mps_health
from mpsgpu import Mps, have_gpu, have_torch_cuda, say

pytestmark = pytest.mark.gpu

if not have_gpu() or os.geteuid() != 0:
    pytest.skip("needs root, an NVIDIA GPU and the real MPS binaries", allow_module_level=True)

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
# A client that keeps its CUDA context and computes again on each line it reads.
CLIENT = """
import sys, torch
x = torch.ones(1024, 1024, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    y = (x @ x).sum().item()
    print("served", y, flush=True)
"""
# The real control socket is SOCK_SEQPACKET: connect, send ``half`` (maybe nothing), hold.
HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
if sys.argv[2]:
    s.send(sys.argv[2].encode())
print("held", flush=True)
time.sleep(3600)
"""


class Procs:
    def __init__(self) -> None:
        self.started: List[subprocess.Popen] = []

    def popen(self, argv: List[str], env: dict, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=env, text=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kw)
        self.started.append(p)
        return p

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait(timeout=30)


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.close()


def client(mps: Mps, procs: Procs, as_nobody: bool = False) -> subprocess.Popen:
    argv = [*(NOBODY if as_nobody else []), sys.executable, "-c", CLIENT]
    c = procs.popen(argv, mps.env, cwd="/")
    assert c.stdout is not None and c.stdout.readline().startswith("ready")
    return c


def served(c: subprocess.Popen) -> bool:
    """The client computes once more on the GPU (through its MPS server)."""
    assert c.stdin is not None and c.stdout is not None
    c.stdin.write("again\n")
    c.stdin.flush()
    return c.stdout.readline().startswith("served")


def hold(mps: Mps, procs: Procs, half: str = "") -> subprocess.Popen:
    h = procs.popen([*NOBODY, sys.executable, "-c", HOLDER, str(mps.pipe / "control"), half],
                    mps.env, cwd="/")
    assert h.stdout is not None and h.stdout.readline().strip() == "held"
    return h


def check(mps: Mps) -> Tuple[int, dict]:
    r = mps.check("--format", "json")
    say(f"--- check: exit {r.returncode}",
        *(f"    {p['state']} {p['code']}: {p['message']} -> {p['action']}"
          for p in json.loads(r.stdout)["problems"]))
    return r.returncode, json.loads(r.stdout)


def found(report: dict, code: str) -> Optional[dict]:
    return next((p for p in report["problems"] if p["code"] == code), None)


def unblock(mps: Mps) -> subprocess.CompletedProcess:
    r = mps_health("remediate", "unblock", "--config", str(mps.config), env=mps.env,
                   timeout=60)
    say("--- remediate unblock: exit " + str(r.returncode),
        *("    " + line for line in r.stdout.splitlines()))
    return r


def healthcheck(mps: Mps) -> subprocess.CompletedProcess:
    r = mps_health("healthcheck", "--config", str(mps.config), env=mps.env, timeout=60)
    say("--- healthcheck: exit " + str(r.returncode),
        *("    " + line for line in r.stdout.splitlines()))
    return r


def answers(mps: Mps) -> bool:
    try:
        return mps.control("get_default_active_thread_percentage", timeout=3).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.parametrize("half", ["", "get_server_li"])
def test_an_idle_connection_is_named_and_freed_with_the_client_still_served(
        mps: Mps, procs: Procs, half: str) -> None:
    mps.start()
    legit = client(mps, procs) if have_torch_cuda() else None
    for cure in (unblock, healthcheck):
        holder = hold(mps, procs, half)
        assert not answers(mps), "an idle connection did not hold the daemon"
        rc, report = check(mps)
        blocked = found(report, "blocked-connection")
        assert rc == 2 and blocked is not None, report
        assert f"pid {holder.pid}" in blocked["message"] and "uid 65534" in blocked["message"]
        assert "remediate reset" not in blocked["action"]
        r = cure(mps)
        assert r.returncode == 0 and "drained (" not in r.stdout, r.stdout
        assert "answers again" in r.stdout, r.stdout
        assert "log-accept-failed" not in r.stdout, "the clients killed meanwhile are ours"
        assert holder.wait(10) is not None and answers(mps)
        if legit is not None:
            assert served(legit), "the legitimate client was not served after the unblock"
    assert check(mps)[0] == 0


def test_a_stopped_genuine_server_of_a_user_is_named_and_ended(mps: Mps, procs: Procs) -> None:
    mps.start()
    server = mps.binary.replace("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
    for cure in (unblock, healthcheck):
        for _ in range(10):  # stopped ~50 ms after its exec, it holds the daemon
            p = procs.popen([*NOBODY, server], mps.env, cwd="/")
            time.sleep(0.05)
            os.kill(p.pid, signal.SIGSTOP)
            if not answers(mps):
                break
            os.kill(p.pid, signal.SIGKILL)
        else:
            pytest.fail("the stopped server never held the daemon in 10 tries")
        rc, report = check(mps)
        blocked = found(report, "blocked-foreign-server") or found(report, "blocked-connection")
        assert rc == 2 and blocked is not None, report
        assert "uid 65534" in blocked["message"], blocked
        r = cure(mps)
        assert r.returncode == 0 and "answers again" in r.stdout, r.stdout
        assert answers(mps)
    assert check(mps)[0] == 0


def test_a_job_s_own_stopped_server_is_continued_and_the_same_client_goes_on(
        mps: Mps, procs: Procs) -> None:
    if not have_torch_cuda():
        pytest.skip("needs torch with CUDA for the client")
    mps.start()
    job = client(mps, procs, as_nobody=True)
    (server,) = [int(x) for x in mps.control("get_server_list").stdout.split()]
    for cure in (unblock, healthcheck):
        os.kill(server, signal.SIGSTOP)
        rc, report = check(mps)
        blocked = found(report, "blocked-server")
        assert rc == 2 and blocked is not None, report
        assert f"kill -CONT {server}" in blocked["action"] and "uid 65534" in blocked["message"]
        r = cure(mps)
        assert r.returncode == 0 and f"pid {server}" in r.stdout, r.stdout
        assert answers(mps) and served(job), "the job's client did not go on"
    assert check(mps)[0] == 0


def test_a_stopped_client_blocks_nothing(mps: Mps, procs: Procs) -> None:
    if not have_torch_cuda():
        pytest.skip("needs torch with CUDA for the clients")
    mps.start()
    first = client(mps, procs, as_nobody=True)
    os.kill(first.pid, signal.SIGSTOP)  # as scontrol suspend does to a job's tasks
    t0 = time.monotonic()
    second = client(mps, procs, as_nobody=True)
    say(f"a second client started in {time.monotonic() - t0:.2f}s beside a stopped one")
    assert served(second)
    assert check(mps)[0] == 0
    os.kill(first.pid, signal.SIGCONT)


def test_a_stopped_daemon_s_action_is_kill_cont(mps: Mps, procs: Procs) -> None:
    mps.start()
    legit = client(mps, procs) if have_torch_cuda() else None
    pid = mps.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        rc, report = check(mps)
        stopped = found(report, "daemon-stopped")
        assert rc == 2 and stopped is not None, report
        assert f"kill -CONT {pid}" in stopped["action"], stopped
        r = unblock(mps)
        assert r.returncode == 0 and "answers again" in r.stdout, r.stdout
    finally:
        os.kill(pid, signal.SIGCONT)
    assert legit is None or served(legit)
