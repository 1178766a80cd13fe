"""The ``mps-health`` command line (and ``mps-health-healthcheck``).

One argparse parser; only the chosen subcommand's module is imported, so a check loads
neither the exporter's nor the Slurm tools' libraries. Every command runs inside the one
error edge (``cli.common.edge``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

from mps_health import __version__
from mps_health.cli.common import Formatter, UsageError, edge, flushed, standard_fds, warn
from mps_health.model.exitcodes import ExitCode

# name -> (module defining register(parser) -> handler, or "module:function" naming
# another register function, one-line help). One line each.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "check": (".cli.check", "run the checks (NHC-style text, or --format json)"),
    "snapshot": (".cli.check:register_snapshot", "save the gathered facts as JSON"),
    "exporter": (".cli.exporter", "serve Prometheus metrics, or write a textfile"),
    "healthcheck": (".cli.check:register_healthcheck", "Slurm HealthCheckProgram: drain/resume"),
    "remediate": (".cli.remediate", "careful repair: reset, drain, resume, ..."),
    "slurm": (".cli.slurm", "gres.conf/slurm.conf from NVML; install job hooks"),
    "unit": (".cli.unit", "steps of the nvidia-mps@ systemd unit: prepare, stop"),
    "clients": (".cli.clients", "who MPS serves: servers, clients, jobs, limits"),
    "explain": (".cli.explain", "a code's runbook entry (no code: list them)"),
    "config": (".cli.explain:register_config", "config example: print the example config"),
    "contrib": (".cli.contrib", "the units, Nagios/Icinga and alert files the package carries"),
    "ack": (".cli.remediate:register_ack", "acknowledge a daemon-restarted or server-churn event"),
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
    for name, (target, help_text) in COMMANDS.items():
        if chosen in COMMANDS and name != chosen:
            continue  # only the chosen one's module is imported, and with it its libraries
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module, _, function = target.partition(":")
            found = importlib.import_module(module, "mps_health")
            p.set_defaults(handler=getattr(found, function or "register")(p))
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
