"""The two steps of contrib/systemd/nvidia-mps@.service that a plain command line cannot
do safely (``mps-health unit prepare|stop``).

* ``prepare`` (ExecStartPre) makes the pipe and log dirs real directories of root without
  following a symlink (``install -d`` would follow one planted in the world-writable
  /tmp), and control.log and server.log root's regular files, so the root daemon never
  appends to a file a user chose. Stale daemon entries are left: it starts among them.
* ``stop`` (ExecStop) sends ``quit -t N`` and waits, bounded, for the daemon to exit:
  systemd SIGTERMs what is left once ExecStop returns, cutting the daemon's own shutdown
  of its servers short. The daemon is found in /proc, not through the pid file, which
  any user may delete or point elsewhere in the 0777 pipe dir.

Exit 0 done; a failure raises ``Failure``: 2 failed, 3 could not start.
"""

import os
from typing import Callable

from mps_health.hostio import runner
from mps_health.hostio.pidfile import read_pid
from mps_health.hostio.planned import record
from mps_health.hostio.safedirs import keep_files
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.facts_deep import LOG_FILES
from mps_health.probes.process_identity import binaries_of, find
from mps_health.remediation.daemonctl import quit_daemon
from mps_health.remediation.dirs import DirTarget, repair
from mps_health.remediation.processes import (
    candidates,
    daemons_in,
    gone,
    pid_file_ignored,
    wait_gone,
)


def prepare(pipe_dir: str, log_dir: str, mode: int, say: Callable[[str], None],
            state_dir: str, log_mode: int = 0o755) -> int:
    if os.geteuid() != 0:
        raise Failure("unit prepare must run as root (it is the unit's ExecStartPre)",
                      ExitCode.CANNOT)
    try:
        for path, path_mode in ((pipe_dir, mode), (log_dir, log_mode)):
            for line in repair("/", DirTarget(path, path_mode, 0, 0, frozenset({0}),
                                              clear=False)):
                say(line)
        # The unit's daemon runs as root (the unit sets no User=).
        for line in keep_files(log_dir, (0,), LOG_FILES):
            say(line)
    except OSError as e:
        raise Failure(f"unit prepare: {e.filename or pipe_dir}: {e.strerror or e}; "
                      "see 'mps-health remediate reset --dry-run'", ExitCode.FAILED) from None
    _planned(state_dir, pipe_dir, "unit start", say)  # the unit's ExecStart starts it next
    return ExitCode.DONE


def _planned(state_dir: str, pipe_dir: str, by: str, say: Callable[[str], None]) -> None:
    """Record the unit's start or stop as planned (never fails the unit)."""
    unrecorded = record(state_dir, pipe_dir, by) if state_dir else ""
    if unrecorded:
        say(unrecorded)


def stop(pipe_dir: str, control: str, timeout_s: float, say: Callable[[str], None],
         state_dir: str) -> int:
    # systemd runs ExecStop as the unit's User=, as it ran ExecStart: the daemon's uid.
    uid = os.geteuid()
    named = read_pid(pipe_dir)
    # The unit names the binary's path; a name is found where every command finds it
    # (process_identity), never on the caller's PATH.
    control = find(control) or control
    daemons = daemons_in(candidates("/proc", binaries_of(control)), (pipe_dir,), (uid,), named)
    ignored = pid_file_ignored(named, daemons, (uid,))
    if ignored:
        say(f"{pipe_dir}: {ignored}")
    if not daemons:
        say(f"no live control daemon of uid {uid} for {pipe_dir}: nothing to stop")
        return ExitCode.DONE
    _planned(state_dir, pipe_dir, "unit stop", say)
    pids = ", ".join(str(d.pid) for d in daemons)
    if len(daemons) > 1:
        say(f"{len(daemons)} control daemons of uid {uid} serve {pipe_dir} ({pids}): "
            "waiting for all of them")
    # quit -t N: the daemon kills servers still busy after N s, so it exits within our wait.
    grace = max(1, int(timeout_s / 2))
    env = runner.child_env({"CUDA_MPS_PIPE_DIRECTORY": pipe_dir})
    problem = quit_daemon(control, None, env, grace, timeout_s)
    if wait_gone("/proc", daemons, 0 if problem else timeout_s):
        say(f"control daemon {pids} for {pipe_dir} has quit" if len(daemons) == 1 else
            f"control daemons {pids} for {pipe_dir} have quit")
        return ExitCode.DONE
    left = ", ".join(str(d.pid) for d in daemons if not gone("/proc", d))
    raise Failure(f"unit stop: control daemon {left or pids} for {pipe_dir} did not exit "
                  + (f"({problem})" if problem else f"within {timeout_s:g}s after quit")
                  + "; systemd ends it now", ExitCode.FAILED)
