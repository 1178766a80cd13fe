"""Core checks against a real MPS daemon on a real GPU.

A daemon in a private pipe dir: healthy (OK), a CUDA client through it (still OK),
then each fault in turn, each reported with its code, and the healthy runs OK.
Run on the GPU node: python3 -m pytest -m gpu tests/gpu -v -s
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from clirun import mps_health, problem_codes
from mpsgpu import Mps, env_info, have_torch_cuda, out_dir, record_proc, say
from nodesite import Site

pytestmark = pytest.mark.gpu

TORCH_CLIENT = """
import os, sys, time, torch
x = torch.ones(2048, 2048, device="cuda")
print("ready", os.getpid(), flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
print("done", flush=True)
"""


def codes(r: subprocess.CompletedProcess) -> list:
    return sorted(problem_codes(r))


LAST_TOOK = [0.0]


def healthy(r: subprocess.CompletedProcess) -> bool:
    """OK, or only reminders of this test's own faults: the servers check's
    daemon-restarted, and the logs check's log-accept-failed (the real daemon logs
    "Unable to accept connection" for the query we killed while it was stopped)."""
    return r.returncode in (0, 1) and set(codes(r)) <= {"daemon-restarted", "log-accept-failed"}


def timed_check(m: Mps, label: str) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    r = m.check("--format", "json")
    LAST_TOOK[0] = took = time.monotonic() - t0
    text = m.check()
    say(f"--- {label}: exit {r.returncode} in {took:.2f}s, codes {codes(r)}",
        *("    " + line for line in text.stdout.splitlines()))
    return r


def test_healthy_then_each_fault(mps: Mps) -> None:
    say(f"== core checks on {env_info().get('gpu', 'the fake')}")
    r = mps.start()
    say(f"nvidia-cuda-mps-control -d: rc {r.returncode} {r.stdout.strip()!r}",
        f"pipe dir entries: {sorted(os.listdir(mps.pipe))}")
    assert timed_check(mps, "healthy").returncode == 0
    pid = mps.daemon_pid()
    assert pid is not None
    record_proc(pid, out_dir() / "proc_h200-daemon")
    q = mps.control("get_default_active_thread_percentage")
    say(f"get_default_active_thread_percentage -> rc {q.returncode} {q.stdout!r}")

    # SIGKILL: all five entries stay, the check says stale.
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    say(f"after SIGKILL, entries: {sorted(os.listdir(mps.pipe))}")
    r = timed_check(mps, "daemon SIGKILLed")
    assert r.returncode == 2 and "daemon-stale" in codes(r)
    again = mps.start()
    say(f"-d in the stale dir: rc {again.returncode} {again.stdout.strip()!r}")
    assert healthy(timed_check(mps, "restarted in the stale dir"))

    # SIGSTOP: wedged, reported within the control timeout + 0.5 s.
    pid = mps.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    r = timed_check(mps, "daemon SIGSTOPped")
    os.kill(pid, signal.SIGCONT)
    assert LAST_TOOK[0] <= 2.0 + 0.5, "wedged daemon not reported within timeout + 0.5 s"
    # The wedge it causes is folded under it: one cause, one problem.
    assert r.returncode == 2 and "daemon-stopped" in codes(r), codes(r)
    assert "control-wedged" not in codes(r), codes(r)
    assert healthy(timed_check(mps, "SIGCONT"))

    # chmod 0700 of the pipe dir.
    mps.pipe.chmod(0o700)
    r = timed_check(mps, "pipe dir chmod 0700")
    assert r.returncode == 2 and "pipe-dir-mode" in codes(r)
    mps.pipe.chmod(0o777)
    assert healthy(timed_check(mps, "pipe dir 0777 again"))

    # Log dir removed (the running daemon keeps its open files).
    moved_log = mps.log.with_name("log-moved-away")
    mps.log.rename(moved_log)
    r = timed_check(mps, "log dir removed")
    assert "log-dir-missing" in codes(r)
    moved_log.rename(mps.log)

    # Pipe dir replaced by a symlink (daemon quit first, as an attacker would find it).
    mps.quit()
    real = mps.pipe.with_name("pipe-real")
    mps.pipe.rename(real)
    mps.pipe.symlink_to(real)
    r = timed_check(mps, "pipe dir is a symlink")
    assert r.returncode == 2 and "pipe-dir-symlink" in codes(r)
    mps.pipe.unlink()
    real.rename(mps.pipe)


def test_cuda_client_through_daemon_stays_ok(mps: Mps) -> None:
    if not have_torch_cuda():
        pytest.skip("needs torch with CUDA")
    mps.start()
    client = subprocess.Popen([sys.executable, "-c", TORCH_CLIENT, "20"], env=mps.env,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = client.stdout.readline() if client.stdout else ""
        say(f"torch client: {line.strip()}")
        servers = mps.control("get_server_list").stdout.split()
        say(f"get_server_list -> {servers}")
        assert servers, "the client did not start an MPS server"
        for s in servers:
            status = mps.control(f"get_server_status {s}").stdout.strip()
            clients = mps.control(f"get_client_list {s}").stdout.split()
            say(f"server {s}: status {status!r}, clients {clients}")
            record_proc(int(s), out_dir() / "proc_h200-server")
        ps = mps.control("ps")
        say("ps ->", *("    " + x for x in ps.stdout.splitlines()))
        r = timed_check(mps, "torch client running through MPS")
        assert r.returncode == 0
    finally:
        client.terminate()
        client.wait(timeout=60)


def test_snapshots_for_examples(mps: Mps) -> None:
    """Real snapshots of a healthy and a broken node for examples/."""
    mps.start()
    out = out_dir()
    cmd = ("snapshot", "--config", str(mps.config))
    mps_health(*cmd, "-o", str(out / "healthy-node.json"), env=mps.env, check=True)
    pid = mps.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    mps.pipe.chmod(0o700)
    mps_health(*cmd, "-o", str(out / "broken-node.json"), env=mps.env, check=True)
    mps.pipe.chmod(0o777)
    say(f"snapshots written to {out}")


def test_start_without_dirs(mps_site: Site) -> None:
    """What the real -d does when the pipe or log dir is missing (remediation relies on it)."""
    m = Mps(mps_site, "nodirs")
    shutil.rmtree(m.pipe)
    shutil.rmtree(m.log)
    r = m.start()
    say(f"-d with no pipe dir and no log dir: rc {r.returncode} out {r.stdout.strip()!r} "
        f"err {r.stderr.strip()!r}; pipe exists {m.pipe.exists()}, log exists {m.log.exists()}")
    q = m.control("get_default_active_thread_percentage")
    say(f"  then a query: rc {q.returncode} {q.stdout.strip()!r}")
    m.quit()
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert m.pipe.is_dir() and m.log.is_dir()  # the daemon made both
    assert q.returncode == 0 and float(q.stdout) == 100.0
    long_base = mps_site.root / ("x" * 100)
    long_base.mkdir()
    m2 = Mps(Site(long_base), "long")
    r = m2.start()
    say(f"-d with a {len(str(m2.pipe))}-character pipe dir: rc {r.returncode} "
        f"{(r.stdout + r.stderr).strip()!r}")
    q = m2.control("get_default_active_thread_percentage")
    m2.quit()
    assert len(str(m2.pipe)) + len("/control_privileged") + 1 > 108
    assert (r.returncode, (r.stdout + r.stderr).strip()) == (1, "")  # silent: hence the check
    # The client fails too (H200, driver 580), rc 1, sometimes silent and sometimes with
    # "Cannot find MPS control daemon process" (both seen, at pipe dirs of different
    # lengths): neither says why, so only the path-length check can.
    assert q.returncode == 1
    assert (q.stdout + q.stderr).strip() in ("", "Cannot find MPS control daemon process")
