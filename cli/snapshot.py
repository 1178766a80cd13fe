"""``mps-health snapshot -o FILE``: save every fact the checks would read, as JSON."""

import argparse
import os
from typing import Callable

from mps_health.cli.common import add_common, load_config
from mps_health.engine import run as engine
from mps_health.engine.snapshot import dumps
from mps_health.hostio.safefiles import write_atomic
from mps_health.model import registry
from mps_health.model.exitcodes import Failure


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the snapshot ('-' for stdout)")
    p.add_argument("--all", action="store_true",
                   help="gather every known source, not only those the enabled checks need")
    return run


def run(args: argparse.Namespace) -> int:
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
