"""``mps-health remediate ACTION``: careful repair, each action planned before it acts
(exit codes: mps_health.remediation.actions); ``mps-health ack``: the event a person
caused on purpose, acknowledged.
"""

import argparse
from typing import Callable

from mps_health.cli.common import add_common, add_config, load_config, say
from mps_health.healthcheck import node_actions
from mps_health.hostio.planned import acknowledge
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.printable import escape
from mps_health.probes.servertrack import EVENT_CODES
from mps_health.remediation import actions, dirs_repair, orphans, tmpfiles_guard

ACTIONS = {
    "reset": "restart one MPS instance: quit, end verified PIDs, fix dirs, start, verify",
    "unblock": "free a control daemon a local process holds (SIGCONT what is ours and "
               "stopped, end a stranger's connection or stopped server); no restart",
    "dirs": "fix pipe/log dir mode, owner or existence in place; the daemon keeps running",
    "drain": "drain this node in Slurm with our tag (never over someone else's drain)",
    "resume": "resume this node only if our tag is still its drain reason",
    "orphans": "stop and remove per-job MPS instances whose job is no longer on the node",
    "tmpfiles-guard": "write the systemd-tmpfiles exclusion for every configured instance",
}


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    sub.required = True
    for name, text in ACTIONS.items():
        a = sub.add_parser(name, help=text, description=text)
        add_common(a)
        a.add_argument("-n", "--dry-run", action="store_true",
                       help="print the plan and change nothing")
        if name == "reset":
            # Several names are one reset of the node (remediation.cooldown_s is per node).
            a.add_argument("instance", nargs="*", metavar="INSTANCE",
                           help="instance names (node, gpu0, job1234)")
            a.add_argument("--all", action="store_true", help="every instance of this node")
            a.add_argument("--force", action="store_true",
                           help="act even on a healthy instance or with clients connected "
                           "(they lose their MPS server), or within "
                           "remediation.cooldown_s of the last reset")
            a.add_argument("--automatic", action="store_true",
                           help="for scripts and fleet tools: the cooldown "
                           "(remediation.cooldown_s) holds even with --force")
        elif name in ("dirs", "unblock"):
            a.add_argument("instance", nargs="*", metavar="INSTANCE",
                           help="instance names (default: every instance of this node)")
        elif name == "drain":
            a.add_argument("--reason", default="manual", help="text after our tag")
        elif name == "tmpfiles-guard":
            a.add_argument("--force", action="store_true",
                           help="overwrite the file even if mps-health did not write it")
    return run


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    if args.action == "reset":
        return actions.reset(config, args.root, args.instance, args.all, args.force,
                             args.dry_run, say, args.automatic)
    if args.action == "unblock":
        return actions.unblock(config, args.root, args.instance, args.dry_run, say)
    if args.action == "dirs":
        return dirs_repair.run(config, args.root, args.instance, args.dry_run, say)
    if args.action in ("drain", "resume"):
        return node_actions.run(config, args.root, args.action,
                                getattr(args, "reason", ""), args.dry_run, say)
    if args.action == "orphans":
        return orphans.run(config, args.root, args.dry_run, say)
    return tmpfiles_guard.run(config, args.root, args.force, args.dry_run, say)


def register_ack(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    p.add_argument("code", choices=EVENT_CODES, help="the event to acknowledge")
    p.add_argument("instance", nargs="?", default="",
                   help="the instance (as the check names it; default: every instance)")
    add_config(p, ", for its state_dir")
    return ack


def ack(args: argparse.Namespace) -> int:
    """``mps-health ack``: ``daemon-restarted`` and ``server-churn`` are reported for
    ``servers.event_window_s``; mps-health's own actions never raise them and a reset answers
    them (hostio/planned.py). One that needs no repair (a daemon restarted on purpose) is
    acknowledged here: CODE's events up to now, on INSTANCE or every instance, are no longer
    reported; the next one is. Root only (the state dir is root's). Exit 0 done, 2 failed."""
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
