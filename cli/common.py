"""What every command shares: the one error edge, output, the config, common options.

Every command (``mps-health SUBCOMMAND``, ``mps-health-healthcheck``, ``check_mps``) runs
inside ``edge``: any failure, expected or not, is one line and an exit code, never a
traceback (MPS_HEALTH_DEBUG=1 shows one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable, List, Optional, TextIO

from mps_health.config.load import Config, ConfigError, load
from mps_health.hostio.resources import OutOfResources
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.printable import escape, lines, printable
from mps_health.model.results import BOOT_GRACE_S


class Formatter(argparse.HelpFormatter):
    """argparse's help layout, sized to the terminal only when help or usage is written.
    argparse also makes a formatter for every add_argument (to check its metavar), and its
    own asks shutil for the terminal's width there: shutil (with bz2 and lzma) imported on
    every run, for a width only -h and a usage error use."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: Optional[int] = None) -> None:
        self._sized = width is not None
        self._position_asked = max_help_position
        super().__init__(prog, indent_increment, max_help_position, 80 if width is None else width)

    def format_help(self) -> str:
        if not self._sized:  # as argparse's own __init__ sizes it
            import shutil  # only here: help or a usage line is being written

            self._width = shutil.get_terminal_size().columns - 2
            self._max_help_position = min(self._position_asked,
                                          max(self._width - 20, self._indent_increment * 2))
            self._sized = True
        return super().format_help()


class UsageError(Exception):
    """Bad arguments: exit 3 (UNKNOWN), as monitoring plugins do, never argparse's 2."""


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


MAX_LINE = 2000


def edge(body: Callable[[], int], say: Callable[[str], None], prefix: str) -> int:
    """Run a command: its exit code, or one line (``prefix`` + what went wrong) through ``say``
    and the failure's code (a UsageError's text is the whole line). Every line is cut to
    MAX_LINE characters: whatever a message quotes, it stays one readable line."""
    def cut(line: str) -> None:
        say(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...")

    try:
        return int(body())
    except UsageError as e:
        cut(str(e))
    # OutOfResources: our own fd or memory limit, never a fact about MPS.
    except (Failure, ConfigError, OutOfResources) as e:
        cut(prefix + str(e))
        return e.code if isinstance(e, Failure) else ExitCode.UNKNOWN
    except KeyboardInterrupt:
        cut(prefix + "interrupted")
    except BrokenPipeError:  # the reader went away: nothing left to say it to
        pass
    except Exception as e:
        if os.environ.get("MPS_HEALTH_DEBUG"):
            raise
        if isinstance(e, OSError):  # the node's trouble (a full disk, a read-only fs), not ours
            where = f"{e.filename}: " if e.filename else ""
            cut(f"{prefix}{where}{e.strerror or one_line(e)}")
        else:
            cut(f"{prefix}internal error: {one_line(e)} (set MPS_HEALTH_DEBUG=1 for a "
                "traceback, and report it)")
    return ExitCode.UNKNOWN


def standard_fds() -> None:
    """Point a closed stdin, stdout or stderr (``mps-health check >&-``) at /dev/null, so
    no file this run opens takes fd 0, 1 or 2 and gets another program's output or ours."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
            if null != fd:  # not possible while fd is free; never leave a stray one open
                os.close(null)


def emit(text: str) -> None:
    """Print ``text`` (one newline added) on stdout; see ``written``."""
    written(lambda out: out.write(text + "\n"))


def written(produce: Callable[[TextIO], object]) -> None:
    """Let ``produce`` write on stdout, then flush. Output no one can read (stdout closed, a
    reader gone: ``| head -c1``, a full disk behind ``>``) loses the text, never the exit
    code the run has earned: that is what slurmd, Nagios and scripts act on."""
    out = sys.stdout
    if out is None:  # started with stdout closed
        return
    try:
        produce(out)
        out.flush()
    except (OSError, ValueError) as e:  # ValueError: the file object was closed
        _discard(out)
        if not isinstance(e, BrokenPipeError):
            warn(f"mps-health: cannot write the output: {getattr(e, 'strerror', None) or e}")


def warn(line: str) -> None:
    """One line on stderr, made printable (it may quote a path); a closed or gone stderr
    loses it, never the exit code."""
    if sys.stderr is not None:  # None: started closed (print would fall back to stdout)
        with contextlib.suppress(OSError, ValueError):
            print(printable(line), file=sys.stderr, flush=True)


def say(text: str) -> None:
    """What an action prints as it goes: its lines, each made printable, flushed."""
    print(lines(text), flush=True)


def flushed() -> None:
    """Flush stdout and stderr before returning the exit code. A stream no one can read is
    pointed at /dev/null, or the interpreter's flush at exit would fail again: exit 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started with it closed
                stream.flush()
        except (OSError, ValueError):
            _discard(stream)


def _discard(out: object) -> None:
    """Send what is left in ``out``'s buffer, and anything later, to /dev/null (``flushed``)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, out.fileno())  # type: ignore[attr-defined]
        os.close(null)


def boot_grace(config: Config) -> float:
    """``healthcheck.boot_grace_s``, for the runs of check, check_mps and the exporter;
    without that section its default, the health check's settings not imported."""
    if "healthcheck" not in config.given:
        return BOOT_GRACE_S
    from mps_health.config.remediation import healthcheck

    return healthcheck(config).boot_grace_s


def load_config(args: argparse.Namespace) -> Config:
    """The config named by --config (else the default file, else the defaults).
    A bad file raises ConfigError: the edge prints it in one line, exit 3."""
    from mps_health.engine import registry  # the check table the checks section names

    return load(getattr(args, "config", None), table=registry)


def system_root(value: str) -> str:
    """argparse type for --root: "/" or an existing absolute directory."""
    if value in ("", "/"):
        return "/"
    if not os.path.isabs(value):
        raise argparse.ArgumentTypeError(f"must be an absolute path (got '{escape(value)}')")
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"'{escape(value)}' is not a directory")
    return value


def names(value: str) -> List[str]:
    """argparse type for 'a,b,c' lists."""
    return [n.strip() for n in value.split(",") if n.strip()]


def budget(value: str) -> float:
    """argparse type for --budget: seconds, 0.1 to 300."""
    seconds = float(value)
    if not 0.1 <= seconds <= 300:
        raise argparse.ArgumentTypeError("must be between 0.1 and 300 seconds")
    return seconds


def add_config(p: argparse.ArgumentParser, why: str = "") -> None:
    p.add_argument("--config", metavar="FILE", help=f"config file{why} (default "
                   "/etc/mps-health/config.yaml if it exists)")


def add_common(p: argparse.ArgumentParser, budget_help: str = "") -> None:
    """--config and --root; with ``budget_help`` also --only, --skip and --budget."""
    add_config(p)
    p.add_argument("--root", metavar="DIR", default="/", type=system_root,
                   help="read every system path under DIR (fixture trees, containers); "
                        "nothing is written then: no state, no locks, no caches")
    if not budget_help:
        return
    p.add_argument("--only", type=names, default=[], metavar="A,B", help="run only these checks")
    p.add_argument("--skip", type=names, default=[], metavar="A,B", help="do not run these checks")
    p.add_argument("--budget", type=budget, metavar="SECONDS", help=budget_help)
