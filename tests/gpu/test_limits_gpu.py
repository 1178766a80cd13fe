"""The limits in force on a live server, on a real GPU: a default changed while a server
runs is not in force for it (``limits-not-in-force`` with both values); once its client
ends and a new client starts a new server, that server has the default and the finding
clears; a default pinned limit set on one GPU both by index and by UUID is
``pinned-limit-ambiguous``, one on an ID naming no GPU ``pinned-limit-unknown-device``.

Only MPS control defaults change here, in a private daemon: never the card's settings.
Run on the GPU node as root: python3 -m pytest -m gpu tests/gpu/test_limits_gpu.py -v -s
(MPS_HEALTH_GPU_FAKE=1: the same on the fake daemon, a sleep standing in for the client).
"""

import json
import os
import subprocess
import sys
import time
from typing import List, Tuple

import pytest
from mpsgpu import USE_FAKE, Mps, env_info, have_gpu, have_torch_cuda, say

pytestmark = pytest.mark.gpu

if not (have_gpu() or USE_FAKE):
    pytest.skip("needs a GPU with the MPS binaries (or MPS_HEALTH_GPU_FAKE=1)",
                allow_module_level=True)

TORCH_CLIENT = """
import os, sys, time, torch
x = torch.ones(1024, 1024, device="cuda")
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
sys.stdin.read()  # until the test closes it
"""
NO_GPU_UUID = "GPU-00000000-0000-0000-0000-000000000000"


class Client:
    """A CUDA client through the instance (torch), or on the fake a sleep it is told of."""

    def __init__(self, mps: Mps) -> None:
        self.mps = mps
        if USE_FAKE:
            self.proc = subprocess.Popen(["sleep", "300"])
            mps.control(f"fake_client_connect {self.proc.pid} {os.getuid()}")
        else:
            self.proc = subprocess.Popen([sys.executable, "-c", TORCH_CLIENT], env=mps.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            say(f"torch client: {line.strip()!r}")
            assert line.startswith("ready"), "the torch client did not start"

    def end(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.terminate()
        self.proc.wait(timeout=60)


def servers(mps: Mps) -> List[str]:
    return mps.control("get_server_list").stdout.split()


def wait_servers_gone(mps: Mps, old: List[str]) -> None:
    """The old server restarted, as an admin would after changing a default: a real server
    idles on after its last client ends (seen on the H200, driver 580), and
    ``shutdown_server PID`` ends it once it has no client; the fake's is stopped so."""
    for pid in old:
        if USE_FAKE:
            mps.control(f"fake_server_stop {pid}")
        else:
            q = mps.control(f"shutdown_server {pid}")
            say(f"shutdown_server {pid} -> rc {q.returncode} {q.stdout!r}")
    end = time.monotonic() + 60
    while set(old) & set(servers(mps)) and time.monotonic() < end:
        time.sleep(0.5)
    assert not set(old) & set(servers(mps)), "the old server outlived its client"


def limits(mps: Mps) -> Tuple[int, List[Tuple[str, str]]]:
    r = mps.check("--only", "limits", "--format", "json")
    text = mps.check("--only", "limits", "-v")
    say(*("    " + line for line in text.stdout.splitlines()))
    data = json.loads(r.stdout)
    return r.returncode, [(p["code"], p["message"]) for p in data["problems"]]


def uuid_of_gpu0(mps: Mps) -> str:
    from mps_health.probes.clientinfo import parse_device_query

    rows = parse_device_query(mps.control("device_query").stdout)["default"]
    say(f"device_query Default: {rows}")
    return next(r.uuid for r in rows if r.ordinal == 0)


def test_a_default_changed_under_a_live_server_then_a_new_server(mps: Mps) -> None:
    if not USE_FAKE and not have_torch_cuda():
        pytest.skip("needs torch with CUDA")
    say(f"== limits on {env_info().get('gpu', 'the fake')}")
    mps.start()
    first = Client(mps)
    try:
        old = servers(mps)
        assert len(old) == 1, old
        rc, found = limits(mps)
        assert (rc, found) == (0, []), found
        for cmd in ("set_default_active_thread_percentage 50",
                    "set_default_device_pinned_mem_limit 0 2G"):
            q = mps.control(cmd)
            say(f"{cmd} -> rc {q.returncode} {q.stdout!r}")
        say(f"server {old[0]} applies "
            f"{mps.control(f'get_active_thread_percentage {old[0]}').stdout.strip()!r}, "
            f"pinned {mps.control(f'get_device_pinned_mem_limit {old[0]} 0').stdout!r}")
        rc, found = limits(mps)
        assert rc == 1 and [c for c, _m in found] == ["limits-not-in-force"] * 2, found
        assert f"server {old[0]} (" in found[0][1]
        assert "applies 100% active threads, the default is 50% (set after it started)" \
            in found[0][1]
        assert "applies a pinned memory limit of no limit on GPU GPU-" in found[1][1]
        assert "the default is 2G" in found[1][1]
    finally:
        first.end()
    wait_servers_gone(mps, old)
    second = Client(mps)
    try:
        new = servers(mps)
        assert len(new) == 1 and new != old, (old, new)
        applied = mps.control(f"get_active_thread_percentage {new[0]}").stdout.strip()
        say(f"new server {new[0]} applies {applied!r}")
        assert float(applied) == 50.0
        rc, found = limits(mps)
        assert (rc, found) == (0, []), found
    finally:
        second.end()


def test_pinned_limits_by_index_and_by_uuid(mps: Mps) -> None:
    if not USE_FAKE and not have_torch_cuda():
        pytest.skip("needs torch with CUDA")
    mps.start()
    uuid = uuid_of_gpu0(mps)
    for cmd in ("set_default_device_pinned_mem_limit 0 4G",
                f"set_default_device_pinned_mem_limit {uuid} 3G",
                f"set_default_device_pinned_mem_limit {NO_GPU_UUID} 8G"):
        q = mps.control(cmd)
        say(f"{cmd} -> rc {q.returncode} {q.stdout!r}")
    for dev in ("0", uuid, NO_GPU_UUID):
        q = mps.control(f"get_default_device_pinned_mem_limit {dev}")
        say(f"get_default_device_pinned_mem_limit {dev} -> rc {q.returncode} {q.stdout!r}")
    client = Client(mps)  # the device table is asked only while a server runs
    try:
        rc, found = limits(mps)
        codes = [c for c, _m in found]
        assert rc == 1 and codes == ["pinned-limit-ambiguous", "pinned-limit-unknown-device"], \
            found
        assert f"by index (0 4G) and by UUID ({uuid} 3G)" in found[0][1]
        assert f"{NO_GPU_UUID} 8G" in found[1][1]
    finally:
        client.end()
