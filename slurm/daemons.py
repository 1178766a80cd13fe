"""A job's MPS daemon: start it as the job's user and quit it.

What is left after a quit is ended by ``mps_health.processes`` (verified PIDs).
"""

import os
import stat
import time
from typing import NamedTuple, Optional

from mps_health.processes import daemon_of

from .runas import RunAs, run_as

NO_DAEMON = "Cannot find MPS control daemon process"
READY_QUERY = "get_default_active_thread_percentage"


class Started(NamedTuple):
    pid: Optional[int]  # None when it did not come up
    detail: str  # what went wrong, or the daemon's first answer
    elapsed_s: float


def _has_socket(pipe_dir: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(os.path.join(pipe_dir, "control")).st_mode)
    except OSError:
        return False


def start_daemon(control: str, pipe_dir: str, as_user: RunAs, env: dict, timeout_s: float,
                 proc_dir: str = "/proc") -> Started:
    """``control -d`` as the job's user; wait until it runs and answers a query."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    launch = run_as([control, "-d"], timeout_s, as_user, env=env)
    if launch.exec_error:
        return Started(None, launch.exec_error, time.monotonic() - t0)
    daemon = None
    pause = 0.005
    while time.monotonic() < deadline:
        daemon = daemon_of(proc_dir, pipe_dir, as_user.uid)
        if daemon is not None and _has_socket(pipe_dir):
            break
        daemon = None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    said = (launch.stdout + launch.stderr).strip()
    if daemon is None:
        why = f"no daemon in {pipe_dir} after {timeout_s:g}s"
        if launch.timed_out:
            why += " (the launcher itself hung)"
        elif launch.rc:
            why += f" (the launcher exited {launch.rc}" + (f": {said!r})" if said else ")")
        return Started(None, why, time.monotonic() - t0)
    answer = run_as([control], max(0.1, deadline - time.monotonic()), as_user,
                    stdin=READY_QUERY + "\n", env=env)
    text = answer.stdout.strip()
    if answer.timed_out or answer.rc != 0 or not text or NO_DAEMON in text:
        why = "timed out" if answer.timed_out else f"rc {answer.rc}, {text or answer.stderr!r}"
        return Started(None, f"daemon {daemon.pid} started but does not answer "
                       f"{READY_QUERY} ({why})", time.monotonic() - t0)
    return Started(daemon.pid, text, time.monotonic() - t0)


def quit_daemon(control: str, pipe_dir: str, as_user: RunAs, env: dict,
                quit_timeout_s: float) -> str:
    """``quit -t N`` through the client as the job's user; "" or what went wrong."""
    force = max(0, round(quit_timeout_s))
    r = run_as([control], quit_timeout_s + 5.0, as_user, stdin=f"quit -t {force}\n", env=env)
    if r.exec_error:
        return r.exec_error
    if r.timed_out:
        return f"'quit -t {force}' got no answer in {quit_timeout_s + 5.0:g}s"
    if r.rc != 0:
        return f"'quit -t {force}' failed: rc {r.rc}: {(r.stdout + r.stderr).strip()!r}"
    return ""
