"""The two steps of contrib/systemd/nvidia-mps@.service that a plain command line cannot
do safely (``mps-health unit prepare|stop``).

* ``prepare`` (ExecStartPre) makes the unit's pipe and log dirs real directories of
  root (pipe dir mode 0777, ``--mode``; log dir 0755, ``--log-mode``: only the daemon
  writes there) without following a symlink: a link, a file or a foreign-owned dir in
  their place is moved aside (as ``remediate reset`` does). ``install -d -m 0777``
  would follow a link planted in the world-writable /tmp. Then control.log and
  server.log in the log dir must be root's regular files (``safedirs.keep_files``): a
  link is removed, anything else moved aside, so the root daemon the unit starts next
  never appends to a file a user chose. Stale daemon entries are left:
  ``nvidia-cuda-mps-control -d`` starts fine in a stale dir (seen on a real daemon).
* ``stop`` (ExecStop) sends ``quit -t N`` through the control client with no shell
  (``echo quit |`` would need one) and waits, bounded, for the daemon named by the pid
  file to exit: systemd sends SIGTERM to what is left as soon as ExecStop returns, which
  would cut the daemon's own clean shutdown of its servers short.

The dirs come from the unit's ``Environment=`` (CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_LOG_DIRECTORY), so the unit file interpolates nothing into a command line.
The command is ``mps-health unit`` (mps_health.core.commands.unit). Exit 0 done, 2 failed
(systemd then marks the start or stop failed), 3 could not start: a failure raises
``Failure`` with that code.
"""

import os
from typing import Callable

from ..core.exitcodes import ExitCode, Failure


def prepare(pipe_dir: str, log_dir: str, mode: int, say: Callable[[str], None],
            state_dir: str, log_mode: int = 0o755) -> int:
    from ..core.facts_deep import LOG_FILES
    from ..core.safedirs import keep_files
    from .dirs import DirTarget, repair

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
    from ..core.planned import record

    unrecorded = record(state_dir, pipe_dir, by) if state_dir else ""
    if unrecorded:
        say(unrecorded)


def stop(pipe_dir: str, control: str, timeout_s: float, say: Callable[[str], None],
         state_dir: str) -> int:
    from ..core import runner
    from ..core.daemonctl import quit_daemon
    from ..core.processes import binaries_of, daemon_of, wait_gone

    daemon = daemon_of("/proc", pipe_dir, binaries_of(control, path_env=os.environ.get("PATH")))
    if daemon is None:
        say(f"no live control daemon for {pipe_dir}: nothing to stop")
        return ExitCode.DONE
    _planned(state_dir, pipe_dir, "unit stop", say)
    pid = daemon.pid
    # quit -t N: the daemon kills servers still busy after N s, so it exits within our wait.
    grace = max(1, int(timeout_s / 2))
    env = runner.child_env({"CUDA_MPS_PIPE_DIRECTORY": pipe_dir})
    problem = quit_daemon(control, None, env, grace, timeout_s)
    if wait_gone("/proc", (daemon,), 0 if problem else timeout_s):
        say(f"control daemon {pid} for {pipe_dir} has quit")
        return ExitCode.DONE
    raise Failure(f"unit stop: control daemon {pid} for {pipe_dir} did not exit "
                  + (f"({problem})" if problem else f"within {timeout_s:g}s after quit")
                  + "; systemd ends it now", ExitCode.FAILED)
