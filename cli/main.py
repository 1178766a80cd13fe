"""The ``mps-health`` command line (and ``mps-health-healthcheck``).

One argparse parser (``mps_health.cli.parser``), with only the chosen subcommand's module
imported, so a check loads neither the exporter's nor the Slurm tools' libraries. Every
command runs inside the one error edge (``cli.common.edge``): a failure ends as one
line on stderr and a Nagios exit code, never a traceback (set MPS_HEALTH_DEBUG=1 to see
one). The subcommands are listed in ``mps_health.cli.parser.COMMANDS``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from mps_health.cli.common import edge, flushed, standard_fds, warn
from mps_health.cli.parser import build
from mps_health.model.exitcodes import ExitCode


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
