"""The ``mps-health`` command line (and ``mps-health-healthcheck``).

One argparse parser; only the chosen subcommand's module is imported, so a check loads
neither the exporter's nor the Slurm tools' libraries. Every command runs inside the one
error edge (``cli.common.edge``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from mps_health import __version__
from mps_health.cli.common import Formatter, UsageError, edge, flushed, standard_fds, warn
from mps_health.model.exitcodes import ExitCode

# Each command's register function (it adds the command's arguments and returns its
# handler), found by a function that imports its module: only the chosen command's
# module is imported.
Handler = Callable[[argparse.Namespace], int]
Register = Callable[[argparse.ArgumentParser], Handler]


def _check() -> Register:
    from mps_health.cli import check
    return check.register


def _snapshot() -> Register:
    from mps_health.cli import check
    return check.register_snapshot


def _exporter() -> Register:
    from mps_health.cli import exporter
    return exporter.register


def _healthcheck() -> Register:
    from mps_health.cli import check
    return check.register_healthcheck


def _remediate() -> Register:
    from mps_health.cli import remediate
    return remediate.register


def _slurm() -> Register:
    from mps_health.cli import slurm
    return slurm.register


def _unit() -> Register:
    from mps_health.cli import unit
    return unit.register


def _clients() -> Register:
    from mps_health.cli import clients
    return clients.register


def _explain() -> Register:
    from mps_health.cli import explain
    return explain.register


def _config() -> Register:
    from mps_health.cli import explain
    return explain.register_config


def _contrib() -> Register:
    from mps_health.cli import contrib
    return contrib.register


def _ack() -> Register:
    from mps_health.cli import remediate
    return remediate.register_ack


# name -> (its register function's finder, one-line help). One line each.
COMMANDS: Dict[str, Tuple[Callable[[], Register], str]] = {
    "check": (_check, "run the checks (NHC-style text, or --format json)"),
    "snapshot": (_snapshot, "save the gathered facts as JSON"),
    "exporter": (_exporter, "serve Prometheus metrics, or write a textfile"),
    "healthcheck": (_healthcheck, "Slurm HealthCheckProgram: drain/resume"),
    "remediate": (_remediate, "careful repair: reset, drain, resume, ..."),
    "slurm": (_slurm, "gres.conf/slurm.conf from NVML; install job hooks"),
    "unit": (_unit, "steps of the nvidia-mps@ systemd unit: prepare, stop"),
    "clients": (_clients, "who MPS serves: servers, clients, jobs, limits"),
    "explain": (_explain, "a code's runbook entry (no code: list them)"),
    "config": (_config, "config example: print the example config"),
    "contrib": (_contrib, "the units, Nagios/Icinga and alert files the package carries"),
    "ack": (_ack, "acknowledge a daemon-restarted or server-churn event"),
}


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)  # the subcommands' parsers too
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} -h)")


def build(argv: Sequence[str]) -> Parser:
    parser = Parser(prog="mps-health", description="Keep NVIDIA MPS healthy on Slurm GPU nodes.")
    parser.add_argument("-V", "--version", action="version", version=f"mps-health {__version__}")
    # prog given: argparse would otherwise format a usage line to find it (the width too)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser,
                                prog=parser.prog)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (register, help_text) in COMMANDS.items():
        if chosen in COMMANDS and name != chosen:
            continue  # only the chosen one's module is imported, and with it its libraries
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            p.set_defaults(handler=register()(p))
    return parser


def dispatch(argv: List[str]) -> int:
    parser = build(argv)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return ExitCode.UNKNOWN
    return int(handler(args))


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    standard_fds()
    code = edge(lambda: dispatch(args), warn, "mps-health: ")
    flushed()
    return code


def healthcheck_main() -> int:
    """``mps-health-healthcheck``, the program slurm.conf names: ``mps-health healthcheck``
    (slurmd passes no arguments)."""
    return main(["healthcheck", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
