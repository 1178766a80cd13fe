"""canary: the real client without libcuda; the orchestration through a fake CUDA client.

The CUDA part itself (libcuda through ctypes) runs on the GPU: tests/gpu/test_deep_gpu.py.
Here the canary command is tests/fakes/mps-canary, which speaks the same protocol and
reaches the fake daemon as a CUDA client reaches MPS.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest
from clirun import mps_health, results
from conftest import FAKES
from mps_health.hostio.runner import Completed
from mps_health.probes import canary as probe
from mps_health.probes import canary_client
from mpsdaemon import start_daemon

NOBODY = 65534


def fake_canary(extra: str = "", when: str = "always") -> str:
    """The fake canary; ``canary.when`` always unless given (the idle gate, its default,
    has its own tests below: this machine is no Slurm node)."""
    if "canary:\n" in extra:
        extra = extra.replace("canary:\n", f"canary:\n  when: {when}\n", 1)
    else:
        extra += f"canary:\n  when: {when}\n"
    return f"commands:\n  mps-health-canary: {FAKES / 'mps-canary'}\n{extra}"


# --- the real client, here without a driver ----------------------------------------------

def test_real_canary_without_libcuda_is_a_clear_unknown(site) -> None:
    out = subprocess.run([sys.executable, "-I", "-S", canary_client.__file__],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 3
    assert out.stdout.startswith("mps-health-canary no-libcuda libcuda.so.1 not found: ")
    site.start_daemon()
    cfg = site.config("canary:\n  when: always\n")
    r = mps_health("check", "--config", cfg, "--only", "canary")
    assert r.returncode == 3
    assert r.stdout.splitlines()[1] == (
        "UNKNOWN canary[node] canary-no-libcuda: libcuda.so.1 not found: no NVIDIA driver "
        "here, so the canary cannot run -> install the NVIDIA driver, or turn the canary "
        "off on this node (checks.disable: [canary]) (runbook: mps-health explain "
        "canary-no-libcuda)")


# --- verdicts (pure) ------------------------------------------------------------------------

def done(stdout: str, rc: int = 0, timed_out: bool = False) -> Completed:
    return Completed(["canary"], None if timed_out else rc, stdout, "", 0.25, timed_out)


def test_verdict_lines() -> None:
    assert probe.parse_verdict("noise\nmps-health-canary ok context_s=0.081234\n") == (
        "ok", {"context_s": "0.081234"}, "context_s=0.081234")
    kind, fields, _ = probe.parse_verdict(
        "mps-health-canary cuda-error step=dlsym code=-1 name=missing symbol cuInit")
    assert kind == "cuda-error" and fields["name"] == "missing symbol cuInit"
    with pytest.raises(ValueError):
        probe.parse_verdict("Segmentation fault\n")


def test_judge_run_keeps_served_and_unserved_apart() -> None:
    ok_line = "mps-health-canary ok context_s=0.081234\n"
    served = probe.judge_run(done(ok_line), (4242, 0.08), 510, 0, 10)
    assert (served.status, served.latency_s, served.server_pid) == ("served", 0.081234, 510)
    alone = probe.judge_run(done(ok_line), (4242, 0.08), 0, 0, 10)
    assert alone.status == "not-served"
    failed = probe.judge_run(done("mps-health-canary cuda-error step=cuCtxCreate code=805 "
                                  "name=CUDA_ERROR_MPS_CONNECTION_FAILED\n", rc=2), None, 0, 0, 10)
    assert failed.cuda_error == "CUDA_ERROR_MPS_CONNECTION_FAILED (805) at cuCtxCreate"
    hung = probe.judge_run(done("", timed_out=True), None, 0, 0, 10)
    assert hung.detail == "no result within 10s (no CUDA context: clients of this pipe dir hang)"
    crashed = probe.judge_run(Completed(["c"], 139, "", "Segmentation fault\n", 0.1), None, 0,
                              0, 10)
    assert crashed.detail == ("the canary exited with status 139 and said: "
                              "Segmentation fault")


# --- orchestration against the fake daemon -----------------------------------------------------

def test_served_by_mps_reports_latency(site) -> None:
    d = site.start_daemon()
    cfg = site.config(fake_canary())
    r = mps_health("check", "--config", cfg, "--only", "canary", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = results(r, "canary")
    server = d.query("get_server_list").stdout.strip()
    assert res["message"].startswith("a CUDA client (pid ")
    assert res["message"].endswith(f"served by MPS server {server}")
    assert res["values"]["canary_served"] == 1 and res["values"]["canary_latency_s"] >= 0
    assert res["values"]["canary_total_s"] > 0


def test_canary_is_off_by_default_without_slurm(site) -> None:
    # With a slurm: section it is on: tests/e2e/test_canary_gate.py.
    d = site.start_daemon()
    cfg = site.config(fake_canary())
    r = mps_health("check", "--config", cfg, "--format", "json")
    assert "canary" not in [c["name"] for c in json.loads(r.stdout)["checks"]]
    assert "fake_client_connect" not in (d.log_dir / "control.log").read_text()


def test_fault_server_fails_the_canary(site) -> None:
    d = site.start_daemon()
    cfg = site.config(fake_canary())
    server = d.query("fake_server_start").stdout.strip()
    d.query(f"fake_server_set {server} FAULT")
    r = mps_health("check", "--config", cfg, "--only", "canary,servers")
    assert r.returncode == 2
    assert ("CRITICAL canary[node] canary-failed: the canary's cuCtxCreate failed: "
            "CUDA_ERROR_MPS_SERVER_NOT_READY (807) through MPS -> run 'mps-health remediate "
            f"reset node --config {cfg}'") in r.stdout
    assert "server-fault" in r.stdout


def test_dead_daemon_means_clients_run_without_mps(site) -> None:
    d = site.start_daemon()
    cfg = site.config(fake_canary())
    d.query("quit")  # its sockets stay behind, as the real daemon's do
    r = mps_health("check", "--config", cfg, "--only", "canary")
    assert r.returncode == 2
    assert "canary-not-served: the canary (pid " in r.stdout
    assert "but no MPS server listed it: CUDA clients of this pipe dir silently run " \
           "without MPS" in r.stdout


def test_stopped_daemon_fails_within_the_timeout(site) -> None:
    d = site.start_daemon()
    cfg = site.config(fake_canary("canary:\n  timeout_s: 2\ncontrol:\n  timeout_s: 0.5\n"))
    d.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        r = mps_health("check", "--config", cfg, "--only", "canary")
    finally:
        d.signal(signal.SIGCONT)
    assert r.returncode == 2
    assert ("canary-timeout: the canary got no result within 2s (no CUDA context: clients of "
            "this pipe dir hang); the control daemon did not answer get_server_list either"
            ) in r.stdout
    assert time.monotonic() - t0 < 15  # bounded by the canary's timeout, not hung


@pytest.fixture
def other_user_client() -> Iterator[subprocess.Popen]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    p = subprocess.Popen(["sleep", "120"], user=NOBODY, group=NOBODY)
    yield p
    p.kill()
    p.wait()


def test_skips_while_another_users_clients_are_connected(site,
                                                         other_user_client) -> None:
    d = site.start_daemon()
    cfg = site.config(fake_canary())
    server = d.query(f"fake_client_connect {other_user_client.pid} {NOBODY}").stdout.strip()
    r = mps_health("check", "--config", cfg, "--only", "canary", "--format", "json")
    assert r.returncode == 0
    (res,) = results(r, "canary")
    assert res["code"] == "canary-skipped"
    assert res["message"] == (
        f"canary not run: 1 client(s) of another user are connected (e.g. "
        f"{other_user_client.pid}, nobody, on server {server}): the canary would queue "
        "behind them")
    assert res["values"]["canary_skipped"] == 1
    assert (d.log_dir / "control.log").read_text().count("fake_client_connect") == 1  # ours


def test_runs_as_the_daemons_user(site) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a daemon as another user")
    python = "/usr/bin/python3"  # one that user nobody may run (a venv under /root is not)
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3 for user nobody")
    pipe, log = site.dirs()
    for p in (pipe, log):
        os.chown(p, NOBODY, NOBODY)
    start_daemon(pipe, log, python=python, user=NOBODY, group=NOBODY)  # ended at close
    # The daemon counts as the instance's only when it runs as mps.daemon_user.
    cfg = site.config(fake_canary(), {"mps": {"daemon_user": "nobody"}})
    r = mps_health("check", "--config", cfg, "--only", "canary")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mps_health("check", "--config", cfg, "--only", "canary", "-v")
    assert f", uid {NOBODY}) got a context in" in r.stdout


def test_bad_canary_section_is_one_line(site) -> None:
    site.dirs()
    cfg = site.config("canary:\n  timeout_s: 0\n")
    r = mps_health("check", "--config", cfg, "--only", "canary")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == f"mps-health: {cfg}: key 'canary.timeout_s': must be a number between " \
           "0.5 and 120 (got 0)\n"


def test_stopped_daemon_fails_the_canary_in_a_whole_check(site) -> None:
    """With the control check in the run too: the canary still runs (and times out) on a
    daemon whose control query went unanswered; the run asks that daemon nothing more."""
    d = site.start_daemon()
    cfg = site.config(fake_canary("canary:\n  timeout_s: 2\ncontrol:\n  timeout_s: 0.5\n"))
    d.signal(signal.SIGSTOP)
    try:
        r = mps_health("check", "--config", cfg, "--only", "control,canary")
    finally:
        d.signal(signal.SIGCONT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "control-wedged" in r.stdout
    assert ("canary-timeout: the canary got no result within 2s (no CUDA context: clients of "
            "this pipe dir hang); the control daemon gave no answer to "
            "get_default_active_thread_percentage this run (no answer within ") in r.stdout
