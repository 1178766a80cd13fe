"""``mps-health ack CODE [INSTANCE]``: acknowledge the servers check's events.

``daemon-restarted`` and ``server-churn`` are reported for ``servers.event_window_s``;
mps-health's own actions never raise them and a reset answers them (hostio/planned.py).
One that needs no repair (a daemon restarted on purpose) is acknowledged here: CODE's
events up to now, on INSTANCE or every instance, are no longer reported; the next one is.
Root only (the state dir is root's). Exit 0 done, 2 failed, 3 bad usage.
"""

import argparse
from typing import Callable

from mps_health.cli.common import load_config
from mps_health.hostio.planned import acknowledge
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.printable import escape
from mps_health.model.servertrack import EVENT_CODES


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    p.add_argument("code", choices=EVENT_CODES, help="the event to acknowledge")
    p.add_argument("instance", nargs="?", default="",
                   help="the instance (as the check names it; default: every instance)")
    p.add_argument("--config", metavar="FILE",
                   help="config file, for its state_dir (default /etc/mps-health/config.yaml "
                   "if it exists)")
    return run


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    instance = args.instance
    if instance and (not instance.isprintable() or len(instance) > 200):
        raise Failure(f"ack: '{escape(instance)}' is not an instance name")
    problem = acknowledge(config.state_dir, args.code, instance)
    if problem:
        raise Failure(f"ack: {problem}", ExitCode.FAILED)
    where = f"on {escape(instance)}" if instance else "on every instance"
    print(f"{args.code} {where} acknowledged: events up to now are no longer reported; "
          "the next one is")
    return ExitCode.DONE
