"""The ``mps-health`` command line.

Only the chosen subcommand's module is imported, and plain ``check`` and ``healthcheck``
runs skip argparse altogether (``fast_args``), so what slurmd and monitoring start every
few minutes pays for nothing else. Every
command runs inside the one error edge (``commands.common.edge``): a failure ends as
one line on stderr and a Nagios exit code, never a traceback (set MPS_HEALTH_DEBUG=1 to
see one). The subcommands are listed in ``mps_health.cli.parser.COMMANDS``.
"""

from __future__ import annotations

import os
import sys

from mps_health.cli.common import SimpleNamespace, edge, standard_fds
from mps_health.model.exitcodes import ExitCode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

# The commands run every few minutes on every node, and what their hand parsers accept:
# flags (option -> (key, value)), valued options (option -> key) and the defaults, which
# are argparse's for the same command (tests/unit/test_fast_args.py compares the two).
FAST: Dict[str, Tuple[Dict[str, Tuple[str, Any]], Dict[str, str], Dict[str, Any]]] = {
    "check": ({"-v": ("verbose", True), "--verbose": ("verbose", True)},
              {"--config": "config", "--root": "root", "--format": "format",
               "--only": "only", "--skip": "skip"},
              {"config": None, "root": "/", "format": "text", "verbose": False, "only": [],
               "skip": [], "replay": None, "budget": None}),
    # slurmd's HealthCheckProgram: mps-health-healthcheck, with no arguments.
    "healthcheck": ({"--detached": ("mode", "detached"), "--foreground": ("mode", "foreground"),
                     "-n": ("dry_run", True), "--dry-run": ("dry_run", True)},
                    {"--config": "config", "--root": "root"},
                    {"config": None, "root": "/", "mode": None, "dry_run": False}),
}


def fast_args(argv: Sequence[str]) -> Optional[SimpleNamespace]:
    """``check`` or ``healthcheck`` with plain options only, parsed by hand; None means
    "ask argparse".

    slurmd runs ``mps-health-healthcheck`` and cron or a monitoring agent ``mps-health
    check`` every few minutes on every node, and argparse with the ``re``, ``typing`` and
    ``gettext`` it imports costs more than the whole check beyond starting Python.
    Anything unusual (help, errors, rarer options) takes the argparse path, which stays
    the one definition of the interface (the commands' ``register``).
    """
    if not argv or argv[0] not in FAST:
        return None
    flags, valued, defaults = FAST[argv[0]]
    ns: Dict[str, Any] = dict(defaults)
    given = set()
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg in flags:
            key, value = flags[arg]
            if key in given and ns[key] != value:
                return None  # --detached with --foreground: argparse says why not
            ns[key] = value
            given.add(key)
            continue
        key, eq, value = arg.partition("=")
        if key not in valued or (not eq and not rest):
            return None
        if not eq:
            value = rest.pop(0)
            if value.startswith("-"):
                return None
        if not value:
            return None
        ns[valued[key]] = value
    if ns.get("format", "text") not in ("text", "json"):
        return None
    if ns["root"] != "/" and not (os.path.isabs(ns["root"]) and os.path.isdir(ns["root"])):
        return None  # argparse's --root type says what is wrong with it

    for key in ("only", "skip"):
        value = ns.get(key)
        if isinstance(value, str):
            ns[key] = [n.strip() for n in value.split(",") if n.strip()]
    return SimpleNamespace(**ns)


def _say(line: str) -> None:
    from mps_health.model.printable import printable

    if sys.stderr is None:  # started with stderr closed (print would fall back to stdout)
        return
    try:
        print(printable(line), file=sys.stderr, flush=True)  # one line: may quote a path
    except (OSError, ValueError):
        pass  # stderr gone too: the exit code says it


def dispatch(argv: List[str]) -> int:
    fast = fast_args(argv)
    if fast is not None:
        if argv[0] == "check":
            from mps_health.cli import check

            return check.run(fast)  # type: ignore[arg-type]
        from mps_health.cli import healthcheck

        return healthcheck.run(fast)  # type: ignore[arg-type]
    # Every other command may run on (the exporter serves for weeks) or through large
    # inputs (a replayed snapshot): the cycle collector the scripts switch off is back.
    # (The health check's detached child is one bounded check run, as a check is.)
    import gc

    gc.enable()
    from mps_health.cli.parser import build

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
    return edge(lambda: dispatch(args), _say, "mps-health: ")


def exit_now(code: int) -> None:
    """Exit without interpreter teardown (a few ms of module cleanup on every run slurmd
    makes; nothing is left to flush after this)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: the program was started with it closed
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    codecache = sys.modules.get("mps_health.hostio.codecache")  # loaded by the bin/ scripts
    if codecache is not None:
        codecache.save()  # only when this run imported something the cache lacked
    os._exit(code)


def console_main() -> None:
    """The ``mps-health`` command."""
    exit_now(main())


def healthcheck_main() -> None:
    """``mps-health-healthcheck``, the program slurm.conf names: ``mps-health healthcheck``
    (slurmd passes no arguments)."""
    exit_now(main(["healthcheck", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
