"""``mps-health config example``: the example config, every key with its default.

The package carries contrib/config.example.yaml, so a node without the source has it.
"""

import argparse
from typing import Callable

from mps_health.cli.common import written
from mps_health.model.exitcodes import ExitCode
from mps_health.model.runbook import EXAMPLE_CONFIG, read_data


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    sub.add_parser("example", help="print the example config (every key, its default, why)",
                   description="print the example config (every key, its default, why)")
    return run


def run(args: argparse.Namespace) -> int:
    text = read_data(EXAMPLE_CONFIG)
    written(lambda out: out.write(text))
    return ExitCode.OK
