"""Ending MPS processes by PID, each verified through /proc just before it is signalled.

A PID is signalled only while /proc shows the very process we planned on: same start
time (so not a reused PID), the same MPS role by cmdline, and not a zombie. Where the
kernel offers pidfds the signal goes through one opened before the check, so even a
PID reused between the check and the signal cannot be hit. Never by name, never a
process group, never a process that only a pid file names.
"""

import contextlib
import os
import signal
import time
from typing import Iterable, List, NamedTuple, Optional, Tuple

from mps_health.facts import Instance, ProcessFact
from mps_health.instances import pipe_paths
from mps_health.probes.proc import read_process

GONE_STATES = ("Z", "X")


class Ended(NamedTuple):
    pid: int
    outcome: str  # "gone" (already), "terminated", "killed", "replaced" (pid reused), "alive"
    detail: str = ""


def of_instance(inst: Instance, procs: Iterable[ProcessFact], root: str = "/"
                ) -> Tuple[Tuple[ProcessFact, ...], Tuple[ProcessFact, ...]]:
    """(control daemons, servers) of ``inst``: by the pipe dir in their environ, and for
    servers also by parentage. A pid file alone never makes a process ours."""
    paths = pipe_paths(inst, root)
    live = [p for p in procs if p.state not in GONE_STATES]
    daemons = tuple(p for p in live if p.role == "control" and p.pipe_dir in paths)
    pids = {d.pid for d in daemons}
    # A server is the daemon's child: its parentage is proof enough, whatever its environ.
    servers = tuple(p for p in live if p.role == "server" and (
        p.pipe_dir in paths or p.ppid in pids))
    return daemons, servers


def still_same(proc_dir: str, fact: ProcessFact) -> Optional[ProcessFact]:
    """The live process ``fact`` describes, or None if it is gone, a zombie or another one."""
    now = read_process(proc_dir, fact.pid)
    if now is None or now.state in GONE_STATES:
        return None
    if now.start_ticks != fact.start_ticks or now.role != fact.role:
        return None
    return now


def _send(pid: int, pidfd: Optional[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)


def _open_pidfd(pid: int) -> Optional[int]:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None  # gone already, or an old kernel: the /proc check still guards us


def gone(proc_dir: str, fact: ProcessFact) -> bool:
    """Has the process ``fact`` describes ended (exited, zombie, or its PID reused)?
    An exiting process loses its cmdline before it becomes a zombie: still running."""
    now = read_process(proc_dir, fact.pid)
    return now is None or now.start_ticks != fact.start_ticks or now.state in GONE_STATES


def _wait_gone(proc_dir: str, fact: ProcessFact, until: float) -> bool:
    while True:
        if gone(proc_dir, fact):
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.05)


def end(proc_dir: str, fact: ProcessFact, term_timeout_s: float) -> Ended:
    """SIGTERM (and SIGCONT, so a stopped process can act on it), then SIGKILL."""
    pidfd = _open_pidfd(fact.pid)
    try:
        now = read_process(proc_dir, fact.pid)
        if now is None or now.state in GONE_STATES:
            return Ended(fact.pid, "gone", "already exited")
        if now.start_ticks != fact.start_ticks or now.role != fact.role:
            return Ended(fact.pid, "replaced", "the PID now names another process: left alone")
        _send(fact.pid, pidfd, signal.SIGTERM)
        _send(fact.pid, pidfd, signal.SIGCONT)
        if _wait_gone(proc_dir, fact, time.monotonic() + term_timeout_s):
            return Ended(fact.pid, "terminated", "ended by SIGTERM")
        # Still there with the same start time (pidfd or not, the same process): kill it.
        _send(fact.pid, pidfd, signal.SIGKILL)
        if _wait_gone(proc_dir, fact, time.monotonic() + 5.0):
            return Ended(fact.pid, "killed", f"ignored SIGTERM for {term_timeout_s:g}s: SIGKILL")
        return Ended(fact.pid, "alive", "still running after SIGKILL (uninterruptible sleep?)")
    finally:
        if pidfd is not None:
            os.close(pidfd)


def end_all(proc_dir: str, facts: Iterable[ProcessFact], term_timeout_s: float) -> List[Ended]:
    return [end(proc_dir, f, term_timeout_s) for f in facts]


def describe(p: ProcessFact) -> str:
    state = {"T": "stopped", "t": "stopped", "D": "uninterruptible"}.get(p.state, "")
    return f"{p.role} {p.pid} (uid {p.uid}{', ' + state if state else ''})"
