"""The ``mps-health`` command line.

Only the chosen subcommand's module is imported, and plain ``check`` runs skip argparse
altogether, so the check slurmd starts every few minutes pays for nothing else. Every
failure ends as one line on stderr and a Nagios exit code, never a traceback (set
MPS_HEALTH_DEBUG=1 to see one).
"""

import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple

EXIT_UNKNOWN = 3

# name -> (module defining register(parser) -> handler, one-line help). One line each.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "check": ("mps_health.commands.check", "run the checks (NHC-style text, or --format json)"),
    "snapshot": ("mps_health.commands.snapshot", "save the gathered facts as JSON"),
    "exporter": ("mps_health.commands.exporter", "serve Prometheus metrics, or write a textfile"),
    "healthcheck": ("mps_health.commands.healthcheck", "Slurm HealthCheckProgram: drain/resume"),
    "remediate": ("mps_health.commands.remediate", "careful repair: reset, drain, resume, ..."),
    "slurm": ("mps_health.slurm.command", "gres.conf/slurm.conf from NVML; install job hooks"),
    "unit": ("mps_health.remediation.unit", "steps of the nvidia-mps@ systemd unit: prepare, stop"),
    "clients": ("mps_health.commands.clients", "who MPS serves: servers, clients, jobs, limits"),
}


class UsageError(Exception):
    """Bad arguments: exit 3 (UNKNOWN), as monitoring plugins do, never argparse's 2."""


FAST_VALUED = {"--config": "config", "--root": "root", "--format": "format", "--only": "only",
               "--skip": "skip"}


def fast_check_args(argv: Sequence[str]) -> Optional[SimpleNamespace]:
    """``check`` with plain options only, parsed by hand; None means "ask argparse".

    slurmd and cron run ``mps-health check`` every few minutes on every node, and
    argparse with the ``re`` it imports costs about 10 ms, most of the check's budget
    beyond starting Python. Anything unusual (help, errors, rarer options) takes the
    argparse path, which stays the one definition of the interface
    (mps_health/commands/check.py); tests compare both paths.
    """
    if not argv or argv[0] != "check":
        return None
    ns: Dict[str, Any] = {"config": None, "root": "/", "format": "text", "verbose": False,
                          "only": [], "skip": [], "replay": None, "budget": None}
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg in ("-v", "--verbose"):
            ns["verbose"] = True
            continue
        key, eq, value = arg.partition("=")
        if key not in FAST_VALUED or (not eq and not rest):
            return None
        if not eq:
            value = rest.pop(0)
            if value.startswith("-"):
                return None
        if not value:
            return None
        ns[FAST_VALUED[key]] = value
    if ns["format"] not in ("text", "json"):
        return None
    for key in ("only", "skip"):
        value = ns[key]
        if isinstance(value, str):
            ns[key] = [n.strip() for n in value.split(",") if n.strip()]
    return SimpleNamespace(**ns)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        fast = fast_check_args(argv)
        if fast is not None:
            from .commands import check

            return check.run(fast)  # type: ignore[arg-type]
        from .argv import build

        parser = build(argv)
        args = parser.parse_args(argv)
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return EXIT_UNKNOWN
        return int(handler(args))
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


def console_main() -> None:
    """The ``mps-health`` command: main(), then exit without interpreter teardown
    (a few ms of module cleanup on every run slurmd makes; nothing is left to flush)."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
