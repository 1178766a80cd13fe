"""Ending MPS processes by verified PID: the one way mps-health signals a process
(``remediate reset``/``orphans``, the Slurm Epilog and Prolog clean-up). Safety rules:

* A process is ours by what /proc says, never because a pid file names it: a control
  daemon or server (``process_identity``: by command line and binary) whose environ
  names the pipe dir, or a server whose parent is such a daemon. Only a process proven
  to run the configured MPS binary is ever signalled, never one only taking its name.
* A pipe dir's daemon (``daemons_in``) is one of the daemon's uid whose environ names
  the pipe dir. The pid file (anyone may rewrite it in a 0777 dir) only picks one /proc
  agrees on (or one whose environ we may not read); naming anything else, it is
  reported and ignored (``pid_file_ignored``).
* Just before a signal /proc must still show the very process planned on (same start
  time, uid and role; no zombie). A pidfd (Linux 5.3+) opened *before* that check
  carries every signal, so a PID reused in between cannot be hit; without pidfds the
  check is repeated before each signal.
* Never by name, never a process group. SIGTERM with SIGCONT (a stopped process acts on
  TERM only when continued), SIGKILL after the grace time, all targets at once: N
  processes cost one grace time, not N.
"""

import contextlib
import os
import signal
import time
from typing import Callable, Collection, Dict, Iterable, List, NamedTuple, Optional, Tuple

from mps_health.hostio.pidfile import read_pid
from mps_health.model.facts import Instance, ProcessFact
from mps_health.probes.context import Context
from mps_health.probes.instances import pipe_paths
from mps_health.probes.proc import binaries_here, identity, read_process, read_processes
from mps_health.probes.process_identity import (
    GONE_STATES,
    Binaries,
    is_daemon,
    is_server,
    proves_nothing,
)


class Ended(NamedTuple):
    """What signalling one process did (``end_all``, ``signal_verified``)."""

    pid: int
    # "gone" (already), "terminated", "killed", "replaced" (pid reused), "alive",
    # "refused" (not proven to run the MPS binary: never signalled), "continued" (SIGCONT)
    outcome: str
    detail: str = ""


def candidates(proc_dir: str, binaries: Optional[Binaries]) -> Tuple[ProcessFact, ...]:
    """Every live control daemon (``is_daemon``) in ``proc_dir``, of any uid and pipe dir."""
    return tuple(p for p in read_processes(proc_dir, binaries) if is_daemon(p))


def daemons_in(procs: Iterable[ProcessFact], paths: Collection[str],
               uids: Optional[Collection[int]], named: Optional[int] = None
               ) -> Tuple[ProcessFact, ...]:
    """The control daemons of ``uids`` (None: any) serving one of ``paths`` by their
    environ, or where it cannot be read the one the pid file names (``named``); never
    another uid's, whatever the pid file (anyone's to write) says."""
    wanted = {os.path.normpath(p) for p in paths}
    return tuple(p for p in procs if is_daemon(p) and (uids is None or p.uid in uids)
                 and (p.pipe_dir in wanted if p.environ_readable else p.pid == named))


def named_daemon(proc_dir: str, pipe_dir: str, binaries: Optional[Binaries], uid: int
                 ) -> Optional[ProcessFact]:
    """The control daemon the pid file names, if /proc agrees it is ``uid``'s serving
    ``pipe_dir``: written once its socket is bound, so a starting daemon is ready."""
    pid = read_pid(pipe_dir)
    p = read_process(proc_dir, pid, binaries) if pid is not None else None
    return p if p is not None and daemons_in((p,), (pipe_dir,), (uid,), pid) else None


def pid_file_ignored(named: Optional[int], daemons: Collection[ProcessFact],
                     uids: Optional[Collection[int]]) -> str:
    """One line when the pid file names a process that is none of ``daemons`` (the ones
    found in /proc, of ``uids``); "" when it agrees or names none."""
    if named is None or named in {d.pid for d in daemons}:
        return ""
    whose = "" if uids is None else " of uid " + " or ".join(map(str, sorted(set(uids))))
    return (f"the pid file names {named}, which is not a control daemon{whose} serving "
            "this pipe dir: ignored, that process is left alone")


def of_pipe_dirs(procs: Iterable[ProcessFact], paths: Collection[str],
                 uids: Optional[Collection[int]] = None
                 ) -> Tuple[Tuple[ProcessFact, ...], Tuple[ProcessFact, ...]]:
    """(control daemons of ``uids``, servers) serving ``paths`` by their environ; a
    daemon's child is its server whatever its environ. Servers run as their clients'
    users: no uid rule."""
    procs = tuple(procs)
    wanted = {os.path.normpath(p) for p in paths}
    daemons = daemons_in(procs, wanted, uids)
    pids, owners = {d.pid for d in daemons}, {d.uid for d in daemons}
    # A stopped or traced server binary of another uid that no daemon started is a user's
    # (it may hold the daemon: unblock ends it), no server of the instance: its clients,
    # if any, are no reason to refuse a reset.
    servers = tuple(p for p in procs if is_server(p) and (
        p.ppid in pids or (p.pipe_dir in wanted and not (proves_nothing(p)
                                                         and p.uid not in owners))))
    return daemons, servers


def of_instance(inst: Instance, procs: Iterable[ProcessFact], root: str = "/",
                uids: Optional[Collection[int]] = None
                ) -> Tuple[Tuple[ProcessFact, ...], Tuple[ProcessFact, ...]]:
    """(control daemons of ``uids``, servers) of ``inst``; under ``--root`` a daemon's
    environ may name its pipe dir with or without the root."""
    return of_pipe_dirs(procs, pipe_paths(inst, root), uids)


def on_node(ctx: Context, inst: Instance, uids: Optional[Collection[int]] = None
            ) -> Tuple[Tuple[ProcessFact, ...], Tuple[ProcessFact, ...]]:
    """``of_instance`` over the processes /proc shows now."""
    return of_instance(inst, read_processes(ctx.proc, binaries_here(ctx)), ctx.root, uids)


def same(proc_dir: str, fact: ProcessFact) -> Optional[ProcessFact]:
    """The live process ``fact`` describes now, or None: gone, a zombie, or another process
    under the same PID (other start time, uid or role)."""
    now = read_process(proc_dir, fact.pid)
    if now is None or now.state in GONE_STATES or \
            (now.start_ticks, now.uid, now.role) != (fact.start_ticks, fact.uid, fact.role):
        return None
    return now


def gone(proc_dir: str, fact: ProcessFact) -> bool:
    """Has the process ``fact`` describes ended (exited, zombie, or its PID reused)?
    An exiting process loses its cmdline before it becomes a zombie: still running."""
    now = read_process(proc_dir, fact.pid)
    return now is None or now.start_ticks != fact.start_ticks or now.state in GONE_STATES


def wait_gone(proc_dir: str, facts: Collection[ProcessFact], timeout_s: float) -> bool:
    """Wait until every process of ``facts`` has ended; False if one is left at the end."""
    return _waited(lambda: all(gone(proc_dir, f) for f in facts), timeout_s)


def _waited(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _open_pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone, or no pidfds: the /proc check still guards us
        return None


def _send(proc_dir: str, fact: ProcessFact, pidfd: Optional[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        elif same(proc_dir, fact) is not None:
            os.kill(fact.pid, sig)


def end_all(proc_dir: str, facts: Iterable[ProcessFact], grace_s: float,
            kill_wait_s: float = 5.0) -> List[Ended]:
    """End each verified process: SIGTERM (+SIGCONT), SIGKILL after ``grace_s``. A process
    not proven to run its configured MPS binary is never signalled ("refused")."""
    ordered = list(dict.fromkeys(facts))
    refused = {f: Ended(f.pid, "refused", "not proven to run the MPS binary: left alone")
               for f in ordered if f.genuine is not True}
    facts = [f for f in ordered if f not in refused]
    pidfds: Dict[int, Optional[int]] = {f.pid: _open_pidfd(f.pid) for f in facts}
    try:
        outcome: Dict[ProcessFact, Ended] = dict(refused)
        targets: List[ProcessFact] = []
        for f in facts:
            now = read_process(proc_dir, f.pid)
            if now is None or now.state in GONE_STATES:
                outcome[f] = Ended(f.pid, "gone", "already exited")
            elif same(proc_dir, f) is None:
                outcome[f] = Ended(f.pid, "replaced",
                                   "the PID now names another process: left alone")
            else:
                targets.append(f)
        for f in targets:
            _send(proc_dir, f, pidfds[f.pid], signal.SIGTERM)
            _send(proc_dir, f, pidfds[f.pid], signal.SIGCONT)
        wait_gone(proc_dir, targets, grace_s)
        for f in targets:
            if gone(proc_dir, f):
                outcome[f] = Ended(f.pid, "terminated", "ended by SIGTERM")
            else:  # still there with the same start time: the same process
                _send(proc_dir, f, pidfds[f.pid], signal.SIGKILL)
        left = [f for f in targets if f not in outcome]
        wait_gone(proc_dir, left, kill_wait_s)
        for f in left:
            outcome[f] = Ended(f.pid, "killed", f"ignored SIGTERM for {grace_s:g}s: SIGKILL") \
                if gone(proc_dir, f) else \
                Ended(f.pid, "alive", "still running after SIGKILL (uninterruptible sleep?)")
        return [outcome[f] for f in ordered]
    finally:
        for fd in pidfds.values():
            if fd is not None:
                os.close(fd)


def describe(p: ProcessFact) -> str:
    state = {"T": "stopped", "t": "stopped", "D": "uninterruptible"}.get(p.state, "")
    return f"{p.role} {p.pid} (uid {p.uid}{', ' + state if state else ''})"


def _same_identity(proc_dir: str, pid: int, uid: int, start_ticks: int) -> Optional[str]:
    """None while ``pid`` is still the process planned on, else "gone" or "replaced"."""
    now = identity(proc_dir, pid)
    if now is None:
        return "gone"
    return None if now == (uid, start_ticks) else "replaced"


def signal_verified(proc_dir: str, pid: int, uid: int, start_ticks: int, end: bool,
                    grace_s: float = 1.0, kill_wait_s: float = 3.0) -> Ended:
    """Continue (``end`` False) or end one process of any binary, by PID, only while /proc
    shows the very process planned on (its uid and start time), through a pidfd opened
    before that check where the kernel has them. Ending: SIGTERM with SIGCONT (a stopped
    process acts on TERM only when continued), SIGKILL after ``grace_s``."""
    pidfd = _open_pidfd(pid)
    try:
        def send(sig: int) -> Optional[str]:
            changed = _same_identity(proc_dir, pid, uid, start_ticks)
            if changed is not None:
                return changed
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                return "gone"
            return None

        def ended(wait_s: float) -> bool:
            return _waited(lambda: _same_identity(proc_dir, pid, uid, start_ticks) is not None,
                           wait_s)

        changed = send(signal.SIGTERM if end else signal.SIGCONT)
        if changed is not None:
            return Ended(pid, changed, "already exited" if changed == "gone" else
                             "the PID now names another process: left alone")
        if not end:
            return Ended(pid, "continued", "continued (SIGCONT)")
        send(signal.SIGCONT)
        if ended(grace_s):
            return Ended(pid, "terminated", "ended by SIGTERM")
        send(signal.SIGKILL)
        if ended(kill_wait_s):
            return Ended(pid, "killed", f"ignored SIGTERM for {grace_s:g}s: SIGKILL")
        return Ended(pid, "alive", "still running after SIGKILL (uninterruptible sleep?)")
    except PermissionError as e:
        return Ended(pid, "alive", f"cannot signal it: {e.strerror}")
    finally:
        if pidfd is not None:
            os.close(pidfd)
