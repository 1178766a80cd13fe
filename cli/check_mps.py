"""``check_mps``: the Nagios/Icinga plugin, in monitoring-plugins' conventions.

A nagiosplugin check (``exporters.nagios``) over the engine run ``mps-health check``
makes: ``MPS <STATE> - summary | perfdata``, long output with ``-v``; exit 0 OK, 1
WARNING, 2 CRITICAL, 3 UNKNOWN. Bad arguments, ``-h`` and ``-V`` exit 3 as
monitoring-plugins' do (argparse's 2 reads as CRITICAL); every failure is one UNKNOWN
line on stdout, never a traceback. The run's budget is below ``-t``, so a wedged daemon
is CRITICAL (control-wedged); only a run overrunning ``-t`` (a probe stuck in the
kernel) is UNKNOWN: ``engine.bounded`` (no SIGALRM) abandons it and kills what it started,
and the Probe says so as nagiosplugin's CheckError.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, NoReturn, Optional, Sequence, Tuple

from mps_health import __version__
from mps_health.cli import common
from mps_health.engine import run as engine
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.results import Report

PROG = "check_mps"
DEFAULT_TIMEOUT = 10
# -w/-c judge the control daemon's answer time: seconds, and no answer takes longer
# than the plugin's own limit (-t, at most 3600).
MAX_SECONDS = 3600


def check_range(text: str) -> str:
    """argparse type: a monitoring-plugins range of seconds, 0..3600."""
    from mps_health.exporters.nagios import Range  # imported (or refused) by run()

    try:
        rng = Range(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid range {text[:40]!r} (forms: 10, 10:, ~:10, "
                                         "10:20, @10:20)") from None
    given = [v for v in (rng.start, rng.end) if v not in (float("-inf"), float("inf"))]
    if any(not 0 <= v <= MAX_SECONDS for v in given):
        raise argparse.ArgumentTypeError(f"range {text[:40]!r} out of bounds: latency "
                                         f"thresholds are seconds from 0 to {MAX_SECONDS}")
    return text


def check_timeout(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid timeout {text!r}: whole seconds") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"timeout {value} out of range 1..3600")
    return value


def parser() -> argparse.ArgumentParser:
    """The whole interface: every option, its help, and a bad one as one UNKNOWN line."""
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise common.UsageError(f"MPS UNKNOWN - {message} (see {PROG} -h)")

    p = Parser(prog=PROG, add_help=False, formatter_class=common.Formatter, description=(
        "Check NVIDIA MPS on this node: control daemons, pipe dirs, and every check "
        "mps-health runs. Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."),
        epilog="Ranges follow the monitoring-plugins syntax: 10 (alert outside 0..10), "
               "10: (below 10), ~:10 (above 10), 10:20, @10:20 (inside). Latency is in "
               "seconds. The plugin's own timeout is UNKNOWN; a daemon that does not answer "
               "within it is CRITICAL (control-wedged).")
    p.add_argument("-w", "--warning", type=check_range, metavar="RANGE",
                   help="control latency warning range in seconds (default: the config's "
                        "control.warn_latency_s, 0.5)")
    p.add_argument("-c", "--critical", type=check_range, metavar="RANGE",
                   help="control latency critical range in seconds (default: twice the "
                        "warning threshold, 1)")
    p.add_argument("-t", "--timeout", type=check_timeout, default=DEFAULT_TIMEOUT,
                   metavar="SECONDS", help=f"the plugin's own time limit (default "
                   f"{DEFAULT_TIMEOUT}); the checks get a budget below it")
    p.add_argument("--only", type=common.names, default=[], metavar="A,B",
                   help="run only these checks (mps-health's names)")
    p.add_argument("--skip", type=common.names, default=[], metavar="A,B",
                   help="do not run these checks")
    common.add_config(p)
    p.add_argument("--root", metavar="DIR", default="/", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="long output: -v every result and action, -vv also timings")
    p.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    p.add_argument("-V", "--version", action="store_true", help="show the version and exit")
    return p


def run(argv: Sequence[str]) -> Tuple[str, int]:
    """(the plugin's output, its exit code)."""
    try:
        from mps_health.exporters import nagios
    except ImportError as e:  # installed without its dependencies
        raise Failure(f"check_mps needs the nagiosplugin library ({e}): pip install "
                      "nagiosplugin into mps-health's virtualenv") from None

    p = parser()
    args = p.parse_args(list(argv))
    if args.help:
        return p.format_help(), ExitCode.UNKNOWN
    if args.version:
        return f"{PROG} v{__version__} (mps-health {__version__})\n", ExitCode.UNKNOWN
    config = common.load_config(args)
    engine.select_checks(config, args.only, args.skip)
    warning, critical = nagios.thresholds(args.warning, args.critical,
                                          config.control.warn_latency_s)
    # -w/-c judge latency here: the control check's own slow-answer warning is off.
    config = config._replace(control=config.control._replace(warn_latency_s=float("inf")))
    budget = engine.budget_within(args.timeout, config.budget_s)
    grace = common.boot_grace(config)

    def judged() -> Report:
        """The run's Report; past -t the plugin's own UNKNOWN, nagiosplugin's CheckError
        (a Resource's way to say it could not measure)."""
        try:
            return engine.run(config, args.root, args.only, args.skip, budget,
                              limit_s=args.timeout, boot_grace_s=grace)[1]
        except engine.Overrun as e:
            busy = f"; still busy with: {', '.join(e.waiting_on)}" if e.waiting_on else ""
            raise nagios.CheckError(f"{PROG} timed out after {args.timeout}s before the "
                                    f"checks finished (raise -t, or look for a hung process "
                                    f"on the node{busy})") from None

    return nagios.render(nagios.Probe(judged), warning, critical, args.verbose)


def main(argv: Optional[List[str]] = None) -> int:
    """The console script: print the output, return the Nagios exit code."""
    out: List[str] = []

    def body() -> int:
        text, code = run(sys.argv[1:] if argv is None else argv)
        out.append(text)
        return code

    def say(line: str) -> None:  # one line, no '|' (it would start perfdata)
        out.append(" ".join(line.replace("|", "/").split()) + "\n")

    common.standard_fds()
    code = common.edge(body, say, "MPS UNKNOWN - ")
    if out:
        common.emit("".join(out).rstrip("\n"))
    common.flushed()
    return code


if __name__ == "__main__":
    sys.exit(main())
