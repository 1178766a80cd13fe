"""``mps-health check``: run the checks and print NHC-style text or JSON; exit 0/1/2/3.

``mps-health snapshot -o FILE`` saves every fact the checks would read, as JSON, for
``check --replay FILE`` to judge; ``mps-health healthcheck`` is the HealthCheckProgram.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from mps_health.cli.common import add_common, boot_grace, emit, load_config, warn, written
from mps_health.config.load import Config, from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.exporters import text
from mps_health.hostio.state import is_fault
from mps_health.model.exitcodes import Failure
from mps_health.model.facts import Facts


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p, "time allowed for gathering facts (default: the config's budget_s)")
    p.epilog = ("Exit status: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (also a bad argument "
                "or config file). On a terminal each problem is one short line and what to do, "
                "in colour unless NO_COLOR is set; -v gives every line whole.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: a summary line, then one line per problem (default); json: "
                        "the whole report")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="every problem line whole, what is OK, and timings")
    p.add_argument("--replay", metavar="FILE", help="judge a saved snapshot instead of this node")
    return run


def replayed(args: argparse.Namespace) -> tuple[Facts, Config]:
    """The facts of a snapshot, and the config to judge them by (--config, else its own)."""
    from mps_health.engine.snapshot import SnapshotError, capped, read  # only for --replay

    try:
        facts, saved_config = read(args.replay)
    except SnapshotError as e:
        raise Failure(str(e)) from None
    if args.config:
        config = load_config(args)
    else:
        # Its node's config, not a file here: the actions' commands name no --config.
        config = from_mapping(saved_config, f"{args.replay} (its config)",
                              registry)._replace(path=None)
    # Whoever wrote the snapshot, it is judged within the bounds of a live run.
    return capped(facts, config.mps.max_instances), config


def run(args: argparse.Namespace) -> int:
    replay = None
    if args.replay:
        replay, config = replayed(args)
    else:
        config = load_config(args)
    facts, report = engine.run(config, args.root, args.only, args.skip, args.budget, replay,
                               boot_grace_s=boot_grace(config))
    # Written as it is formatted: many instances never make one huge string.
    if args.format == "json":
        from mps_health.exporters import json as json_out

        written(lambda out: json_out.write(report, out))
    else:
        written(lambda out: text.write(report, out, args.verbose, *terminal(out)))
    # One line on stderr per state file that could not be saved (a full or broken state
    # dir): the verdict above stands, only history is lost until it can be saved.
    for name in sorted(facts.sources) if replay is None else ():  # a replay saves none
        note = getattr(facts.sources[name], "state_error", "")
        if isinstance(note, str) and is_fault(note):
            warn(f"mps-health: warning: {note} (the {name} check's history is not kept until "
                 "it can be saved; the verdict is not affected)")
    return report.state


def terminal(out: object) -> tuple[int, bool]:
    """(width, colour) where ``out`` is a terminal: its width as the help finds it
    (``COLUMNS`` first) and colour unless ``NO_COLOR`` is set (https://no-color.org) or
    ``TERM`` is dumb. (0, False) elsewhere: slurmd, pipes and files get the lines as they are."""
    try:
        if not os.isatty(out.fileno()):  # type: ignore[attr-defined]
            return 0, False
    except (AttributeError, OSError, ValueError):
        return 0, False
    import shutil  # only on a terminal: a run for slurmd, a pipe or a file does without it

    colour = not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return shutil.get_terminal_size().columns or 80, colour


def register_snapshot(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the snapshot ('-' for stdout)")
    p.add_argument("--all", action="store_true",
                   help="gather every known source, not only those the enabled checks need")
    return snapshot


def snapshot(args: argparse.Namespace) -> int:
    from mps_health.engine.snapshot import dumps
    from mps_health.hostio.safefiles import write_atomic

    config = load_config(args)
    if args.all:
        needs = list(registry.SOURCES)
    else:
        needs = [n for c in engine.select_checks(config) for n in c.needs]
    facts = engine.facts_within(config, args.root, needs, config.budget_s)
    text = dumps(facts, config.raw)
    if args.output == "-":
        print(text)
        return 0
    try:
        write_atomic(os.path.abspath(args.output), (text + "\n").encode(), 0o644)
    except OSError as e:
        raise Failure(f"{args.output}: cannot write: {e.strerror or e}") from None
    print(f"snapshot of {facts.node} written to {args.output} "
          f"({len(facts.sources)} sources, {len(facts.errors)} errors)")
    return 0


def register_healthcheck(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--detached", dest="mode", action="store_const", const="detached",
                      help="answer with the last result, check in the background "
                      "(default: the config's healthcheck.detached)")
    mode.add_argument("--foreground", dest="mode", action="store_const", const="foreground",
                      help="check now and answer with this run's result")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="judge and say what would be done; no drain, no resume, no state saved")
    return healthcheck


def healthcheck(args: argparse.Namespace) -> int:
    """``mps-health healthcheck`` (``mps-health-healthcheck``), the Slurm HealthCheckProgram.
    slurmd passes no arguments: the config is /etc/mps-health/config.yaml, the node name
    SLURMD_NODENAME. The run (mps_health.healthcheck.run) drains or resumes only when that
    must change; the exit status is the checks' state: slurmd logs a failed run's output."""
    from mps_health.healthcheck.run import main_run
    from mps_health.hostio.runner import SAFE_PATH
    from mps_health.model.printable import printable

    if not os.environ.get("PATH"):  # slurmd's: find scontrol and the MPS client
        os.environ["PATH"] = SAFE_PATH
    result = main_run(load_config(args), args.root, args.dry_run, args.mode)
    emit("\n".join(printable(line) for line in result.lines))
    return result.rc
