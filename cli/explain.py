"""What the package carries to read on the node (model/runbook.py).

``mps-health explain [CODE]``: a code's entry in docs/runbook.md; no code: the
list. A code with no entry (a typo, a site's own check) is one line and exit 3.
``mps-health config example``: contrib/config.example.yaml, every key with its default.
"""

import argparse
import difflib
import importlib
from typing import Callable, Dict, List

from mps_health.cli.common import emit, written
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.healthcheck import run as healthcheck
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.printable import escape
from mps_health.model.runbook import EXAMPLE_CONFIG, entries, read_data


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    p.add_argument("code", nargs="?", metavar="CODE",
                   help="a code from a problem line, e.g. daemon-stale (none: list them all)")
    return run


def declared() -> List[str]:
    """Every code mps-health reports, check by check, as the checks declare them."""
    codes: Dict[str, None] = {}
    for spec in registry.checks().values():
        if spec.target.startswith("."):  # a site's own check documents its codes itself
            module = importlib.import_module(spec.target.partition(":")[0], "mps_health")
            codes.update(dict.fromkeys(getattr(module, "CODES", ())))
    codes.update(dict.fromkeys((*engine.CODES, *healthcheck.CODES)))
    return list(codes)


def run(args: argparse.Namespace) -> int:
    found = entries()
    if args.code is None:
        # The codes the checks report, then every other entry 'explain CODE' prints
        # (alerts, limits, a check's heading over its table of codes).
        listed = [c for c in declared() if c in found]
        listed += [c for c in found if c not in listed]
        width = max(len(c) for c in listed)
        emit("\n".join(f"{c:<{width}}  {found[c].summary}" for c in listed))
        return ExitCode.OK
    entry = found.get(args.code)
    if entry is None:
        near = difflib.get_close_matches(args.code, list(found), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise Failure(f"no runbook entry for '{escape(args.code, 60)}'{hint}: "
                      "'mps-health explain' lists every code; a site's own check documents "
                      "its codes itself", ExitCode.UNKNOWN)
    emit(entry.text)
    return ExitCode.OK


def register_config(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    sub.add_parser("example", help="print the example config (every key, its default, why)",
                   description="print the example config (every key, its default, why)")
    return print_example


def print_example(args: argparse.Namespace) -> int:
    text = read_data(EXAMPLE_CONFIG)
    written(lambda out: out.write(text))
    return ExitCode.OK
