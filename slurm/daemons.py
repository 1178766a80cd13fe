"""A job's MPS processes: start its daemon as the job's user, quit it, end what is left.

Processes are found in /proc (``mps_health.probes.proc``): control daemons whose
environment names one of the job's pipe dirs, and servers whose environment names it
or whose parent is such a daemon. They are signalled only after checking, again in
/proc, that each PID is still the process we saw (same start time) and is not a
zombie: a PID reused by an unrelated process is never touched.
"""

import os
import signal
import stat
import time
from typing import Collection, List, NamedTuple, Optional, Tuple

from mps_health.facts import ProcessFact
from mps_health.probes.proc import read_process, read_processes

from .runas import RunAs, run_as

PID_FILE = "nvidia-cuda-mps-control.pid"
NO_DAEMON = "Cannot find MPS control daemon process"
READY_QUERY = "get_default_active_thread_percentage"


class Started(NamedTuple):
    pid: Optional[int]  # None when it did not come up
    detail: str  # what went wrong, or the daemon's first answer
    elapsed_s: float


def job_processes(proc_dir: str, pipe_dirs: Collection[str]) -> Tuple[ProcessFact, ...]:
    """Live MPS daemons and servers that belong to the job's pipe dirs."""
    wanted = {os.path.normpath(p) for p in pipe_dirs}
    procs = [p for p in read_processes(proc_dir) if p.state not in ("Z", "X")]
    daemons = {p.pid for p in procs if p.role == "control" and p.pipe_dir in wanted}
    return tuple(p for p in procs
                 if p.pid in daemons or (p.role == "server" and (
                     p.pipe_dir in wanted or p.ppid in daemons)))


def alive(proc_dir: str, fact: ProcessFact) -> bool:
    """Still the process we saw (pid and start time), and not a zombie."""
    now = read_process(proc_dir, fact.pid)
    return now is not None and now.start_ticks == fact.start_ticks and now.state not in "ZX"


def _pid_file(pipe_dir: str) -> Optional[int]:
    try:
        fd = os.open(os.path.join(pipe_dir, PID_FILE),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


def _has_socket(pipe_dir: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(os.path.join(pipe_dir, "control")).st_mode)
    except OSError:
        return False


def serving_daemon(proc_dir: str, pipe_dir: str, uid: int) -> Optional[ProcessFact]:
    """The daemon the pid file names, if it is a live control daemon of ``uid`` on ``pipe_dir``."""
    pid = _pid_file(pipe_dir)
    if pid is None:
        return None
    p = read_process(proc_dir, pid)
    if p is None or p.role != "control" or p.state in ("Z", "X") or p.uid != uid:
        return None
    if p.pipe_dir is not None and p.pipe_dir != os.path.normpath(pipe_dir):
        return None
    return p


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
        daemon = serving_daemon(proc_dir, pipe_dir, as_user.uid)
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


def end_processes(proc_dir: str, facts: Collection[ProcessFact], grace_s: float,
                  ) -> Tuple[List[ProcessFact], List[ProcessFact]]:
    """SIGTERM, then SIGKILL after ``grace_s``, each verified PID; (ended, survivors)."""
    targets = [f for f in facts if alive(proc_dir, f)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for f in targets:
            if alive(proc_dir, f):
                _signal(f.pid, sig)
                if f.state in ("T", "t") and sig == signal.SIGTERM:
                    _signal(f.pid, signal.SIGCONT)  # a stopped process acts on TERM only now
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(proc_dir, f) for f in targets):
            time.sleep(0.02)
        if not any(alive(proc_dir, f) for f in targets):
            break
    survivors = [f for f in targets if alive(proc_dir, f)]
    return [f for f in targets if f not in survivors], survivors


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(proc_dir: str, facts: Collection[ProcessFact], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(proc_dir, f) for f in facts):
        time.sleep(0.02)
