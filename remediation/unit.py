"""``mps-health unit prepare|stop``: the two steps of contrib/systemd/nvidia-mps@.service
that a plain command line cannot do safely.

* ``prepare`` (ExecStartPre) makes the unit's pipe and log dirs real directories of
  root, mode 0777, without following a symlink: a link, a file or a foreign-owned dir
  in their place is moved aside (as ``remediate reset`` does). ``install -d -m 0777``
  would follow a link planted in the world-writable /tmp. Stale daemon entries are left:
  ``nvidia-cuda-mps-control -d`` starts fine in a stale dir (seen on a real daemon).
* ``stop`` (ExecStop) sends ``quit -t N`` through the control client with no shell
  (``echo quit |`` would need one) and waits, bounded, for the daemon named by the pid
  file to exit: systemd sends SIGTERM to what is left as soon as ExecStop returns, which
  would cut the daemon's own clean shutdown of its servers short.

The dirs come from the unit's ``Environment=`` (CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_LOG_DIRECTORY), so the unit file interpolates nothing into a command line.
Exit 0 done, 2 failed (systemd then marks the start or stop failed), 3 bad usage.
"""

import argparse
import os
from typing import Callable, Optional

DONE, FAILED, CANNOT = 0, 2, 3
PID_FILE = "nvidia-cuda-mps-control.pid"


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="step", metavar="STEP", parser_class=type(p))
    sub.required = True
    for name, text in (("prepare", "make the pipe and log dirs safely (ExecStartPre)"),
                       ("stop", "quit the daemon and wait for it to exit (ExecStop)")):
        a = sub.add_parser(name, help=text, description=text)
        a.add_argument("--pipe-dir", default=os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                       help="default: $CUDA_MPS_PIPE_DIRECTORY")
        if name == "prepare":
            a.add_argument("--log-dir", default=os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
                           help="default: $CUDA_MPS_LOG_DIRECTORY")
            a.add_argument("--mode", default="0777", help="mode of both dirs (octal)")
        else:
            a.add_argument("--control", default="nvidia-cuda-mps-control",
                           help="the control client (the unit names its absolute path)")
            a.add_argument("--timeout", type=float, default=20.0,
                           help="seconds to wait for the daemon to exit (below the unit's "
                           "TimeoutStopSec)")
    return run


def run(args: argparse.Namespace) -> int:
    from mps_health.commands.common import fail

    if not args.pipe_dir or not os.path.isabs(args.pipe_dir):
        return fail(f"unit {args.step}: set CUDA_MPS_PIPE_DIRECTORY (an absolute path) in "
                    "the unit's Environment=, or give --pipe-dir", CANNOT)
    if args.step == "prepare":
        if not args.log_dir or not os.path.isabs(args.log_dir):
            return fail("unit prepare: set CUDA_MPS_LOG_DIRECTORY (an absolute path) in the "
                        "unit's Environment=, or give --log-dir", CANNOT)
        try:
            mode = int(args.mode, 8)
        except ValueError:
            return fail(f"unit prepare: --mode {args.mode!r} is not an octal mode", CANNOT)
        return prepare(args.pipe_dir, args.log_dir, mode, print)
    return stop(args.pipe_dir, args.control, args.timeout, print)


def prepare(pipe_dir: str, log_dir: str, mode: int, say: Callable[[str], None]) -> int:
    from mps_health.commands.common import fail

    from .dirs import DirTarget, repair

    if os.geteuid() != 0:
        return fail("unit prepare must run as root (it is the unit's ExecStartPre)", CANNOT)
    try:
        for path in (pipe_dir, log_dir):
            for line in repair("/", DirTarget(path, mode, 0, 0, frozenset({0}), clear=False)):
                say(line)
    except OSError as e:
        return fail(f"unit prepare: {e.filename or pipe_dir}: {e.strerror or e}; "
                    "see 'mps-health remediate reset --dry-run'", FAILED)
    return DONE


def _daemon_pid(pipe_dir: str) -> Optional[int]:
    """The pid file's PID, if that process is a live control daemon (cmdline checked)."""
    try:
        with open(os.path.join(pipe_dir, PID_FILE), "rb") as f:
            pid = int(f.read(32).strip() or b"0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    if pid <= 0 or state in (b"Z", b"X") or \
            os.path.basename(argv0) != b"nvidia-cuda-mps-control":
        return None
    return pid


def stop(pipe_dir: str, control: str, timeout_s: float, say: Callable[[str], None]) -> int:
    import time

    from mps_health import runner
    from mps_health.commands.common import fail

    pid = _daemon_pid(pipe_dir)
    if pid is None:
        say(f"no live control daemon for {pipe_dir}: nothing to stop")
        return DONE
    # quit -t N: the daemon kills servers still busy after N s, so it exits within our wait.
    grace = max(1, int(timeout_s / 2))
    env = runner.child_env({"CUDA_MPS_PIPE_DIRECTORY": pipe_dir})
    r = runner.run([control], timeout_s, stdin=f"quit -t {grace}\n", env=env)
    if r.exec_error:
        return fail(f"unit stop: cannot run {control}: {r.exec_error}", FAILED)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _daemon_pid(pipe_dir) != pid:
            say(f"control daemon {pid} for {pipe_dir} has quit")
            return DONE
        time.sleep(0.1)
    return fail(f"unit stop: control daemon {pid} for {pipe_dir} did not exit within "
                f"{timeout_s:g}s after quit; systemd ends it now", FAILED)
