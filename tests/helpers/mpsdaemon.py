"""Start, ask and end an MPS control daemon: one way for every test, fake or real binary.

The fake is an executable (tests/fakes/nvidia-cuda-mps-control run by the launcher that
tests/helpers/fakebin.py builds) and runs as a real binary does; a script given instead runs
under the interpreter given. The daemon writes its PID file after binding its socket, so a
started daemon is one whose PID file names a new PID. Daemons end by the PID we started,
never by name.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from paths import FAKE_CONTROL

PID_FILE = "nvidia-cuda-mps-control.pid"


def control_argv(control: str = FAKE_CONTROL, *args: str,
                 python: Optional[str] = sys.executable) -> List[str]:
    """The argv of the control program; a script runs under ``python`` unless it is None."""
    with open(control, "rb") as f:
        script = f.read(2) == b"#!"
    return [python, control, *args] if script and python else [control, *args]


def mps_env(pipe: Path, log: Optional[Path] = None,
            env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """This environment plus ``env`` and the instance's pipe (and log) directory."""
    full = dict(os.environ, **(env or {}))
    full["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
    if log is not None:
        full["CUDA_MPS_LOG_DIRECTORY"] = str(log)
    return full


def launch(pipe: Path, log: Path, control: str = FAKE_CONTROL, *,
           env: Optional[Mapping[str, str]] = None, inherit: bool = True,
           python: Optional[str] = sys.executable, timeout: float = 30,
           **kwargs: Any) -> subprocess.CompletedProcess:
    """``control -d`` serving ``pipe``, its exit and output as they are (what the real
    binary does is itself a finding). ``env`` adds to this environment (replaces it when
    not ``inherit``); ``kwargs`` go to subprocess.run (user, group, cwd for another user)."""
    full = mps_env(pipe, log, env) if inherit else \
        {**(env or {}), "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    return subprocess.run(control_argv(control, "-d", python=python), env=full,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def start_daemon(pipe: Path, log: Path, control: str = FAKE_CONTROL, *,
                 old: Optional[int] = None, timeout: float = 30, **kwargs: Any) -> int:
    """A daemon serving ``pipe`` (see launch); returns its PID once the PID file names one
    other than ``old``, by default the one a stale PID file names (an earlier daemon's,
    never taken for the new one's)."""
    if old is None:
        old = read_pid(pipe)
    r = launch(pipe, log, control, timeout=timeout, **kwargs)
    assert r.returncode == 0, f"{control} -d exited {r.returncode}: {r.stdout}{r.stderr}"
    return wait_pid_file(pipe, old, timeout)


def read_pid(pipe: Path) -> Optional[int]:
    """The PID ``pipe``'s PID file names now, if any."""
    try:
        return int((pipe / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def wait_pid_file(pipe: Path, old: Optional[int] = None, timeout: float = 10.0) -> int:
    """The PID in ``pipe``'s PID file once it names one other than ``old``."""
    pid_file = pipe / PID_FILE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if pid != old:
                return pid
        time.sleep(0.01)
    raise AssertionError(f"no new pid file in {pipe}")


def query(pipe: Path, command: str, control: str = FAKE_CONTROL, *, timeout: float = 10,
          env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """One command to the daemon serving ``pipe``, as a user types it into the client."""
    return subprocess.run(control_argv(control), input=command + "\n",
                          env=mps_env(pipe, env=env), capture_output=True, text=True,
                          timeout=timeout)


def kill_daemon(pid: int) -> None:
    """SIGKILL the daemon we started (woken first if stopped), and reap it if ours."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def quit_daemon(pipe: Path, pid: int, control: str = FAKE_CONTROL, *, command: str = "quit",
                env: Optional[Mapping[str, str]] = None, grace: float = 5.0) -> None:
    """Ask the daemon to quit as an admin would; SIGKILL it by PID if it is still there
    after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        query(pipe, command, control, timeout=grace + 15, env=env)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        kill_daemon(pid)


def stop_process(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP ``pid`` (one the test started) and return once /proc shows it stopped. The
    kernel stops a process only when it next runs, which a loaded machine delays: a check
    started at once could still see it running (a deadline for a lost signal, no timing)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # gone: nothing left to stop
        if state in ("T", "t", "Z", "X"):
            return
        assert time.monotonic() < deadline, f"{pid} not stopped {timeout:g}s after SIGSTOP"
        time.sleep(0.005)
