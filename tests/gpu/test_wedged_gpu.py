"""A wedged daemon with a live client and its server costs one timeout, on the real
binaries: ``mps-health check``, ``check_mps`` and ``mps-health clients`` each wait for
the control query once and do not ask the stopped daemon for its servers again.

Run on the H200 as root: ``python3 -m pytest -m gpu tests/gpu/test_wedged_gpu.py -v -s``
(or ``bash tests/gpu/run.sh``). The bound is the control timeout (2 s here) + 0.5 s.
"""

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Tuple

import pytest
from clirun import check_mps, mps_health
from mpsgpu import Mps, have_gpu, have_torch_cuda, say

pytestmark = pytest.mark.gpu

if not have_gpu() or os.geteuid() != 0:
    pytest.skip("needs root, an NVIDIA GPU and the real MPS binaries", allow_module_level=True)

CLIENT = """
import sys, torch
x = torch.ones(1024, 1024, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""
TIMEOUT_S = 2.0  # the control timeout Mps configures


def timed(label: str, run: Callable[[], subprocess.CompletedProcess]
          ) -> Tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = run()
    took = time.monotonic() - t0
    say(f"--- {label}: exit {r.returncode} in {took:.2f}s",
        *("    " + line for line in r.stdout.splitlines()[:12]))
    return r, took


def test_a_wedged_daemon_under_a_live_client_costs_one_timeout(mps: Mps) -> None:
    if not have_torch_cuda():
        pytest.skip("needs torch with CUDA for the client")
    mps.start()
    pid = mps.daemon_pid()
    assert pid is not None
    client = subprocess.Popen([sys.executable, "-c", CLIENT], env=mps.env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stopped = False
    try:
        assert client.stdout is not None and client.stdout.readline().startswith("ready")
        assert mps.control("get_server_list").stdout.split(), "no MPS server for the client"
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        check, check_s = timed("check -v, daemon stopped under a live client",
                               lambda: mps.check("-v"))
        plugin, plugin_s = timed("check_mps -v", lambda: check_mps(
            "--config", str(mps.config), "-t", "10", "-v", env=mps.env, timeout=60))
        view, view_s = timed("clients", lambda: mps_health(
            "clients", "--config", str(mps.config), env=mps.env, timeout=60))
        os.kill(pid, signal.SIGCONT)
        stopped = False
        say(f"one timeout is {TIMEOUT_S:g}s: check {check_s:.2f}s, check_mps {plugin_s:.2f}s, "
            f"clients {view_s:.2f}s")
        assert check.returncode == 2 and "daemon-stopped" in check.stdout, check.stdout
        assert "skipped: not asked: the control daemon gave no answer" in check.stdout
        assert plugin.returncode == 2, plugin.stdout
        assert view.returncode in (0, 1, 2, 3) and "Traceback" not in view.stderr, view.stderr
        for took in (check_s, plugin_s, view_s):
            assert took <= TIMEOUT_S + 0.5, "more than one timeout"
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        if client.stdin is not None:
            client.stdin.close()
        try:
            client.wait(timeout=60)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait(timeout=10)
