"""Who is on MPS, on a real GPU: `mps-health clients` and the clients check against torch
clients of two users and five jobs through one node-wide daemon.

Run on the H200 as root: ``python3 -m pytest -m gpu tests/gpu/test_clients_gpu.py -v -s``
(or ``bash tests/gpu/run.sh``). The scenario is ``tests/gpu/clients_scenario.py`` (its
docstring says what runs); its captures (raw control answers, NVML, /proc, the outputs,
snapshots) land in $OUT/captures/clients. With MPS_HEALTH_GPU_FAKE=1 the same runs on the
fake daemon, without CUDA (the numbers CUDA gives are then not checked).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"
REAL = shutil.which("nvidia-smi") is not None and shutil.which("nvidia-cuda-mps-control") \
    is not None and not FAKE
if not (REAL or FAKE):
    pytest.skip("needs a GPU with the MPS binaries (or MPS_HEALTH_GPU_FAKE=1)",
                allow_module_level=True)
if os.geteuid() != 0 or shutil.which("unshare") is None:
    pytest.skip("runs as root with unshare (users, a private pipe dir)", allow_module_level=True)


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    base = os.environ.get("OUT")
    out = Path(base, "captures", "clients") if base else Path("/tmp/mpsh-clients-gpu-out")
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, str(HERE / "clients_scenario.py"), *(["--fake"] if FAKE else []),
            str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=580)
    print(r.stdout[-20000:], r.stderr[-4000:], flush=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def clients_by_job(view: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {c["job_id"]: dict(c, server=s) for inst in view["instances"]
            for s in inst["servers"] for c in s["clients"]}


def problems(check: Dict[str, Any], name: str = "clients") -> List[tuple]:
    return sorted((p["code"], p["message"]) for p in check.get("problems", ())
                  if p["check"] == name)


def test_view_shows_servers_clients_jobs_and_limits(results: Dict[str, Any]) -> None:
    view = results["views"]["alice"]
    assert view["rc"] == 0
    inst = view["instances"][0]
    assert inst["pipe_dir"] == "/tmp/nvidia-mps" and inst["default_thread_percentage"] == 60.0
    assert inst["default_pinned_mem_limits"] == {"0": "4G"}
    (server,) = inst["servers"]
    assert (server["user"], server["status"], server["thread_percentage"]) == \
        ("mpsh-alice", "ACTIVE", 60.0)
    (device,) = server["devices"]
    assert device["uuid"].startswith("GPU-") and device["pinned_mem_limit"] == "4G"
    assert device["contexts"] == 4
    jobs = clients_by_job(view)
    assert sorted(jobs) == ["101", "102", "103", "104"]
    want = {"101": (30.0, 30.0), "102": (100.0, 60.0), "103": (None, 60.0), "104": (20.0, 20.0)}
    got = {j: (c["env_thread_percentage"], c["thread_ceiling"]) for j, c in jobs.items()}
    assert got == want
    assert jobs["103"]["env_pipe_dir"] is None and jobs["103"]["job_gres"] == "gres:gpu:1"
    assert jobs["102"]["env_pinned_mem_limit"] == "0=2G"
    assert all(c["user"] == "mpsh-alice" and c["job_from"] == "environ" for c in jobs.values())
    if REAL:
        assert all(c["gpu_memory_bytes"] and c["gpu_memory_bytes"] > 2**28
                   for c in jobs.values()), "NVML gives each client's memory"
        assert all(c["gpus"] == [device["uuid"][:22]] for c in jobs.values())


def test_check_reports_each_client_correctly(results: Dict[str, Any]) -> None:
    check = results["checks"]["alice"]
    found = problems(check)
    assert [code for code, _ in found] == ["client-not-mps-job", "client-over-limit"]
    assert "job 103" in found[0][1] and "'gres:gpu:1', not mps" in found[0][1]
    assert "CUDA_MPS_PIPE_DIRECTORY is unset, so the default pipe dir took it" in found[0][1]
    assert "job 102" in found[1][1] and "may use 60%" in found[1][1]
    assert check["exit_code"] == 1


def test_the_other_user_gets_a_server_of_his_own(results: Dict[str, Any]) -> None:
    view = results["views"]["bob"]
    jobs = clients_by_job(view)
    assert list(jobs) == ["201"]
    bob = jobs["201"]
    assert bob["user"] == "mpsh-bob" and bob["server"]["user"] == "mpsh-bob"
    assert (bob["env_thread_percentage"], bob["thread_ceiling"]) == (50.0, 50.0)
    assert problems(results["checks"]["bob"]) == []


def test_what_cuda_gave_each_client(results: Dict[str, Any]) -> None:
    """The ceiling the view computes is what CUDA enforced; a program's own setenv is not
    seen in /proc (job 104: 20 at exec, 100 set inside, got the server's 60 %)."""
    if not REAL:
        pytest.skip("no CUDA on the fake")
    sms = {name: info["sms"] for name, info in results["ready"].items()}
    full = 132  # the H200's multiprocessors
    assert sms["job101"] < sms["job102"] == sms["job103"] == sms["job104"]
    assert sms["job102"] <= round(full * 0.6) + 1 and sms["job101"] <= round(full * 0.3) + 1
    assert sms["job105"] <= round(full * 0.5) + 1  # the server lowered to 50 before it came
