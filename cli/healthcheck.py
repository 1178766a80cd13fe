"""``mps-health healthcheck``: the Slurm HealthCheckProgram (also ``mps-health-healthcheck``).

slurmd passes no arguments: the config is /etc/mps-health/config.yaml, the node name
SLURMD_NODENAME. The run (mps_health.healthcheck.run) drains or resumes only when that
must change; the exit status is the checks' state: slurmd logs the output of a failed run.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from mps_health.cli.common import add_common, emit, load_config
from mps_health.healthcheck.run import main_run
from mps_health.hostio.runner import SAFE_PATH
from mps_health.model.printable import printable


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--detached", dest="mode", action="store_const", const="detached",
                      help="answer with the last result, check in the background "
                      "(default: the config's healthcheck.detached)")
    mode.add_argument("--foreground", dest="mode", action="store_const", const="foreground",
                      help="check now and answer with this run's result")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="judge and say what would be done; no drain, no resume, no state saved")
    return run


def run(args: argparse.Namespace) -> int:
    if not os.environ.get("PATH"):  # slurmd's: find scontrol and the MPS client
        os.environ["PATH"] = SAFE_PATH
    result = main_run(load_config(args), args.root, args.dry_run, args.mode)
    emit("\n".join(printable(line) for line in result.lines))
    return result.rc
