"""Starting and quitting an MPS control daemon: the one way, for ``remediate reset`` and
``orphans``, ``unit stop`` and the Slurm Prolog/Epilog. A start is proven by the daemon's
pid file (written once its socket is bound), /proc agreeing, and one answered query.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Mapping, NamedTuple, Optional

from mps_health.hostio.runas import RunAs, run_as
from mps_health.probes.control import NO_DAEMON, QUERY
from mps_health.probes.process_identity import binaries_of
from mps_health.remediation.processes import named_daemon


class Started(NamedTuple):
    pid: Optional[int]  # None when it did not come up
    detail: str  # what went wrong, or the daemon's first answer
    elapsed_s: float
    start_ticks: Optional[int] = None  # the daemon's start time, with pid: its identity


def _has_socket(pipe_dir: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(os.path.join(pipe_dir, "control")).st_mode)
    except OSError:
        return False


def start_daemon(control: str, pipe_dir: str, as_user: Optional[RunAs], env: Mapping[str, str],
          timeout_s: float, proc_dir: str = "/proc") -> Started:
    """``control -d`` as ``as_user`` (None: as we are); wait until it runs and answers."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    uid = as_user.uid if as_user is not None else os.geteuid()
    launch = run_as([control, "-d"], timeout_s, as_user, env=env)
    if launch.exec_error:
        return Started(None, launch.exec_error, time.monotonic() - t0)
    daemon = None
    pause = 0.005
    binaries = binaries_of(control)  # callers give its path (process_identity.locate)
    while time.monotonic() < deadline:
        daemon = named_daemon(proc_dir, pipe_dir, binaries, uid)
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
                    stdin=QUERY + "\n", env=env)
    text = answer.stdout.strip()
    if answer.timed_out or answer.rc != 0 or not text or NO_DAEMON in text:
        why = "timed out" if answer.timed_out else f"rc {answer.rc}, {text or answer.stderr!r}"
        return Started(None, f"daemon {daemon.pid} started but does not answer "
                       f"{QUERY} ({why})", time.monotonic() - t0)
    return Started(daemon.pid, text, time.monotonic() - t0, daemon.start_ticks)


def quit_daemon(control: str, as_user: Optional[RunAs], env: Mapping[str, str], grace_s: float,
         timeout_s: float) -> str:
    """``quit -t N`` (N: ``grace_s``, whole seconds) through the client; "" when the daemon
    took it, else one line saying what went wrong."""
    force = max(1, round(grace_s))
    r = run_as([control], timeout_s, as_user, stdin=f"quit -t {force}\n", env=env)
    if r.exec_error:
        return r.exec_error
    if r.timed_out:
        return f"'quit -t {force}' got no answer in {timeout_s:g}s"
    said = (r.stdout + r.stderr).strip()
    if r.rc != 0 or NO_DAEMON in said:
        return f"'quit -t {force}' failed: rc {r.rc}: {said!r}"
    return ""
