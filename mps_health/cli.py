"""The ``mps-health`` command line.

Only the chosen subcommand's module is imported, so ``mps-health check`` pays for
nothing else. Every failure ends as one line on stderr and a Nagios exit code, never
a traceback (set MPS_HEALTH_DEBUG=1 to see one).
"""

import argparse
import os
import sys
from typing import Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from . import __version__

EXIT_UNKNOWN = 3

# name -> (module defining register(parser) -> handler, one-line help). One line each.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "check": ("mps_health.commands.check", "run the checks (NHC-style text, or --format json)"),
    "snapshot": ("mps_health.commands.snapshot", "save the gathered facts as JSON"),
    "healthcheck": ("mps_health.commands.healthcheck", "Slurm HealthCheckProgram: drain/resume"),
    "remediate": ("mps_health.commands.remediate", "careful repair: reset, drain, resume, ..."),
}


class UsageError(Exception):
    """Bad arguments: exit 3 (UNKNOWN), as monitoring plugins do, never argparse's 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} -h)")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="config file (default /etc/mps-health/config.yaml if it exists)")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read every system path under DIR (fixture trees, containers)")


def build(argv: Sequence[str]) -> Tuple[Parser, Optional[str]]:
    parser = Parser(prog="mps-health", description="Keep NVIDIA MPS healthy on Slurm GPU nodes.")
    parser.add_argument("-V", "--version", action="version", version=f"mps-health {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            import importlib

            handler = importlib.import_module(module).register(p)
            p.set_defaults(handler=handler)
    return parser, chosen


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser, _chosen = build(argv)
        args = parser.parse_args(argv)
        handler: Optional[Callable[[argparse.Namespace], int]] = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return EXIT_UNKNOWN
        return handler(args)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return EXIT_UNKNOWN
    except KeyboardInterrupt:
        print("mps-health: interrupted", file=sys.stderr)
        return EXIT_UNKNOWN
    except BrokenPipeError:
        return EXIT_UNKNOWN
    except Exception as e:  # the edge: one line, UNKNOWN
        if os.environ.get("MPS_HEALTH_DEBUG"):
            raise
        text = (str(e).strip().splitlines() or [""])[0]
        print(f"mps-health: internal error: {type(e).__name__}: {text} "
              "(set MPS_HEALTH_DEBUG=1 for a traceback, and report it)", file=sys.stderr)
        return EXIT_UNKNOWN


if __name__ == "__main__":
    sys.exit(main())
