"""``mps-health unit prepare|stop`` (mps_health.remediation.unit). The dirs come from the
unit's ``Environment=``, so the unit file interpolates nothing into a command line.
Exit 0 done, 2 failed (systemd marks the start or stop failed), 3 bad usage.
"""

import argparse
import os
from typing import Callable

from mps_health.cli.common import add_config, load_config, say
from mps_health.config.load import ConfigError
from mps_health.config.schema import octal_mode
from mps_health.model.exitcodes import Failure
from mps_health.remediation.unit import prepare, stop


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="step", metavar="STEP", parser_class=type(p))
    sub.required = True
    for name, text in (("prepare", "make the pipe and log dirs safely (ExecStartPre)"),
                       ("stop", "quit the daemon and wait for it to exit (ExecStop)")):
        a = sub.add_parser(name, help=text, description=text)
        a.add_argument("--pipe-dir", default=os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                       help="default: $CUDA_MPS_PIPE_DIRECTORY")
        add_config(a, ", for its state_dir, where the start or stop is recorded as planned")
        if name == "prepare":
            a.add_argument("--log-dir", default=os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
                           help="default: $CUDA_MPS_LOG_DIRECTORY")
            # The config's rule for a mode; argparse names the option in a bad one's line.
            a.add_argument("--mode", default="0777", type=octal_mode,
                           help="mode of the pipe dir (octal)")
            a.add_argument("--log-mode", default="0755", type=octal_mode,
                           help="mode of the log dir (octal; only the daemon writes there)")
        else:
            a.add_argument("--control", default="nvidia-cuda-mps-control",
                           help="the control client (the unit names its absolute path)")
            a.add_argument("--timeout", type=float, default=20.0,
                           help="seconds to wait for the daemon to exit (below the unit's "
                           "TimeoutStopSec)")
    return run


def run(args: argparse.Namespace) -> int:
    if not args.pipe_dir or not os.path.isabs(args.pipe_dir):
        raise Failure(f"unit {args.step}: set CUDA_MPS_PIPE_DIRECTORY (an absolute path) in "
                      "the unit's Environment=, or give --pipe-dir")
    if args.step == "prepare":
        if not args.log_dir or not os.path.isabs(args.log_dir):
            raise Failure("unit prepare: set CUDA_MPS_LOG_DIRECTORY (an absolute path) in the "
                          "unit's Environment=, or give --log-dir")
        if args.log_mode & 0o700 != 0o700:
            raise Failure(f"unit prepare: --log-mode {args.log_mode:04o} must let the daemon "
                          "(root) read, write and enter the log dir (0700 at least)")
        return prepare(args.pipe_dir, args.log_dir, args.mode, say, _state_dir(args),
                       args.log_mode)
    return stop(args.pipe_dir, args.control, args.timeout, say, _state_dir(args))


def _state_dir(args: argparse.Namespace) -> str:
    """Where to record the planned start or stop; "" (with a line) when the config is bad:
    the unit must still start and stop."""
    try:
        return load_config(args).state_dir
    except ConfigError as e:
        say(f"not recorded as a planned restart: {e}")
        return ""
