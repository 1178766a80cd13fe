"""What a problem's action carries: the commands it advises, the run's options, and where
to read more.

A check advises a command as its argv (``advice("run ", ("mps-health", "remediate",
"reset", name), " (dry run first: --dry-run)")``): the action's text quotes it as
``shlex.join`` writes it, made printable, between single quotes, and the result keeps
the argv (``Result.commands``), so nothing reads a command back out of text. A run
given ``--config FILE`` or ``--root TREE`` judged other instances, so ``applied`` gives
each advised ``mps-health`` command the run's options its subcommand takes (``TAKES``)
and quotes it again (the default config file and ``--root /`` add nothing). A problem
whose code mps-health documents then ends with ``(runbook: mps-health explain CODE)``.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from mps_health.engine import registry
from mps_health.model.printable import printable
from mps_health.model.results import CheckRun, Command, Result, is_problem

Options = Tuple[Tuple[str, str], ...]

# Subcommand -> the run options it takes (the tests check each against its argparse
# definition); one not listed takes none of them (explain).
TAKES = {**dict.fromkeys(("check", "snapshot", "clients", "exporter", "healthcheck",
                          "remediate"), ("--config", "--root")),
         "unit": ("--config",), "ack": ("--config",)}
RESET = ("mps-health", "remediate", "reset")
VERBOSE = ("mps-health", "check", "-v")


class Advice(NamedTuple):
    """An action's text and the commands it quotes, in the order it quotes them."""

    text: str
    commands: Tuple[Command, ...] = ()


def quoted(argv: Command) -> str:
    """``argv`` as an action quotes it: one shell command line between single quotes, made
    printable (a control character in a file name shows escaped, never reaches a
    terminal)."""
    return f"'{printable(shlex.join(argv))}'"


def advice(*parts: Union[str, Command, Advice]) -> Advice:
    """The action made of ``parts``: text as it is, a command (argv) quoted, an advice's
    text and commands in their place."""
    text: List[str] = []
    commands: List[Command] = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
        elif isinstance(part, Advice):
            text.append(part.text)
            commands.extend(part.commands)
        else:
            text.append(quoted(part))
            commands.append(part)
    return Advice("".join(text), tuple(commands))


def run_options(config_path: Optional[str], root: str = "/") -> Options:
    """The options of a run that change what a command acts on: ``--config`` unless it is
    the default file, ``--root`` unless it is ``/``; absolute, so a command pasted in
    another directory acts on the same files."""
    from mps_health.config.load import DEFAULT_PATH

    found: List[Tuple[str, str]] = []
    if config_path and os.path.abspath(config_path) != DEFAULT_PATH:
        found.append(("--config", os.path.abspath(config_path)))
    if root and root != "/":
        found.append(("--root", os.path.abspath(root)))
    return tuple(found)


def given(argv: Command, options: Options) -> Command:
    """``argv`` with the options its ``mps-health`` subcommand takes that it does not name
    already, after its own words."""
    if argv[:1] != ("mps-health",) or len(argv) < 2:
        return argv
    takes = TAKES.get(argv[1], ())
    extra = [word for opt, value in options
             if opt in takes and opt not in argv
             and not any(w.startswith(opt + "=") for w in argv)
             for word in (opt, value)]
    return (*argv, *extra)


def with_options(action: Advice, options: Options) -> Advice:
    """``action`` with each command given the run's ``options`` and quoted again in its
    place (found where it was quoted, in order)."""
    if not options or not action.commands:
        return action
    text: List[str] = []
    at = 0
    commands = tuple(given(argv, options) for argv in action.commands)
    for old, new in zip(action.commands, commands):
        start = action.text.find(quoted(old), at)
        if start < 0:  # a text that does not quote it: only its argv changes
            continue
        text += [action.text[at:start], quoted(new)]
        at = start + len(quoted(old))
    return Advice("".join(text) + action.text[at:], commands)


def cooling(runs: Iterable[CheckRun], last_reset: float, cooldown_s: float, now: float,
            log_dirs: Mapping[str, str], audit_log: str) -> Tuple[CheckRun, ...]:
    """The runs with every problem's action that advises a reset saying so where that
    reset would now be refused for ``remediation.cooldown_s`` (the node's last reset at
    ``last_reset``): until when, and where to read why the last one did not cure (the
    instance's control.log in ``log_dirs``, the audit log); --force goes past it."""
    left = last_reset + cooldown_s - now
    if cooldown_s <= 0 or not 0 < left <= cooldown_s:
        return tuple(runs)
    until = time.strftime("%H:%M:%S %Z", time.localtime(last_reset + cooldown_s))

    def one(r: Result) -> Result:
        if not is_problem(r) or not any(argv[:3] == RESET for argv in r.commands):
            return r
        log = os.path.join(log_dirs[r.instance], "control.log") if r.instance in log_dirs \
            else "the instance's control.log"
        return r._replace(action=f"{r.action}; but a reset is refused until {until} (the "
                          f"node's last reset was {now - last_reset:.0f}s ago, "
                          f"remediation.cooldown_s {cooldown_s:g}): read {log} and the audit "
                          f"log {audit_log} for why it did not cure, then add --force if it "
                          "must be now")
    return tuple(run._replace(results=tuple(map(one, run.results))) for run in runs)


def read_more(action: str, code: str) -> str:
    """``action`` ending with where the code's runbook entry is."""
    where = f"runbook: mps-health explain {code}"
    return f"{action} ({where})" if action else where


def applied(runs: Iterable[CheckRun], options: Options, any_check: Tuple[str, ...] = ()
            ) -> Tuple[CheckRun, ...]:
    """The runs with every action's commands given the run's options, and every problem's
    action its runbook entry (``any_check``: codes documented whatever check reports
    them, the engine's)."""
    def one(r: Result, ours: bool) -> Result:
        action, commands = with_options(Advice(r.action, r.commands), options)
        if is_problem(r) and (ours or r.code in any_check):  # folded: no action
            action = read_more(action, r.code)
        return r if action == r.action else r._replace(action=action, commands=commands)

    out = []
    for run in runs:
        # mps-health documents a built-in check's codes; a site's own check (named as an
        # importable module) documents its own.
        spec = registry.checks().get(run.name)
        ours = spec is not None and spec.target.startswith(".")
        out.append(run._replace(results=tuple(one(r, ours) for r in run.results)))
    return tuple(out)
