"""``mps-health check``: run the checks and print NHC-style text or JSON; exit 0/1/2/3."""

from __future__ import annotations

from ..exitcodes import Failure
from .common import add_common, emit, load_config, names

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

if TYPE_CHECKING:
    import argparse

    from ..config import Config
    from ..facts import Facts


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("-v", "--verbose", action="store_true", help="also list what is OK, and timings")
    p.add_argument("--only", type=names, default=[], metavar="A,B", help="run only these checks")
    p.add_argument("--skip", type=names, default=[], metavar="A,B", help="do not run these checks")
    p.add_argument("--replay", metavar="FILE", help="judge a saved snapshot instead of this node")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="time allowed for gathering facts (default: the config's budget_s)")
    return run


def replayed(args: argparse.Namespace) -> tuple[Facts, Config]:
    """The facts of a snapshot, and the config to judge them by (--config, else its own)."""
    from ..config import from_mapping
    from ..snapshot import SnapshotError, loads

    try:
        with open(args.replay, encoding="utf-8") as f:
            facts, saved_config = loads(f.read(), args.replay)
    except OSError as e:
        raise Failure(f"{args.replay}: cannot read: {e.strerror}") from None
    except SnapshotError as e:
        raise Failure(str(e)) from None
    if args.config:
        return facts, load_config(args)
    return facts, from_mapping(saved_config, f"{args.replay} (its config)")


def run(args: argparse.Namespace) -> int:
    from .. import engine

    replay = None
    if args.replay:
        replay, config = replayed(args)
    else:
        config = load_config(args)
    if args.budget is not None and not 0.1 <= args.budget <= 300:
        raise Failure("--budget must be between 0.1 and 300 seconds")
    facts, report = engine.run(config, args.root, args.only, args.skip, args.budget, replay)
    if args.format == "json":
        from ..exporters import json as json_out

        emit(json_out.render(report))
    else:
        from ..exporters import text

        emit(text.render(report, verbose=args.verbose))
    if replay is None:
        say_state_faults(facts)
    return report.state


def say_state_faults(facts: Facts) -> None:
    """One line on stderr per state file that could not be saved (a full or broken
    state dir): the verdict above stands, only history is lost until it can be saved."""
    import sys

    from ..printable import printable
    from ..state import is_fault

    for name in sorted(facts.sources):
        note = getattr(facts.sources[name], "state_error", "")
        if isinstance(note, str) and is_fault(note) and sys.stderr is not None:
            try:
                print(printable(f"mps-health: warning: {note} (the {name} check's history is "
                                "not kept until it can be saved; the verdict is not affected)"),
                      file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
