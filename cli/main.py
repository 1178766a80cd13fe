"""The ``mps-health`` command line (and ``mps-health-healthcheck``).

One argparse parser; only the chosen subcommand's module is imported, so a check loads
neither the exporter's nor the Slurm tools' libraries. Every command runs inside the one
error edge (``cli.common.edge``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

from mps_health import __version__
from mps_health.cli.common import Formatter, UsageError, edge, flushed, standard_fds, warn
from mps_health.model.exitcodes import ExitCode

Handler = Callable[[argparse.Namespace], int]
Register = Callable[[argparse.ArgumentParser], Handler]

# name -> one-line help. One line each.
COMMANDS: Dict[str, str] = {
    "check": "run the checks (NHC-style text, or --format json)",
    "snapshot": "save the gathered facts as JSON",
    "exporter": "serve Prometheus metrics, or write a textfile",
    "healthcheck": "Slurm HealthCheckProgram: drain/resume",
    "remediate": "careful repair: reset, drain, resume, ...",
    "slurm": "gres.conf/slurm.conf from NVML; install job hooks",
    "unit": "steps of the nvidia-mps@ systemd unit: prepare, stop",
    "clients": "who MPS serves: servers, clients, jobs, limits",
    "explain": "a code's runbook entry (no code: list them)",
    "config": "config example: print the example config",
    "contrib": "the units, Nagios/Icinga and alert files the package carries",
    "ack": "acknowledge a daemon-restarted or server-churn event",
}


def register_of(name: str) -> Register:
    """The register function of command ``name`` (it adds the command's arguments and
    returns its handler). Its module is imported here, so a run imports only the chosen
    command's module, and with it only that command's libraries."""
    if name in ("check", "snapshot", "healthcheck"):
        from mps_health.cli import check
        return {"check": check.register, "snapshot": check.register_snapshot,
                "healthcheck": check.register_healthcheck}[name]
    if name in ("remediate", "ack"):
        from mps_health.cli import remediate
        return remediate.register if name == "remediate" else remediate.register_ack
    if name in ("explain", "config"):
        from mps_health.cli import explain
        return explain.register if name == "explain" else explain.register_config
    if name == "exporter":
        from mps_health.cli import exporter
        return exporter.register
    if name == "slurm":
        from mps_health.cli import slurm
        return slurm.register
    if name == "unit":
        from mps_health.cli import unit
        return unit.register
    if name == "clients":
        from mps_health.cli import clients
        return clients.register
    from mps_health.cli import contrib
    return contrib.register


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
    for name, help_text in COMMANDS.items():
        if chosen in COMMANDS and name != chosen:
            continue  # only the chosen one's module is imported, and with it its libraries
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            p.set_defaults(handler=register_of(name)(p))
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
