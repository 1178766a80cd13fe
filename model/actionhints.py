"""What a problem line's action ends with: the run's own options, and where to read more.

A check quotes the commands it advises as ``'mps-health SUBCOMMAND ...'`` for the default
node. A run given ``--config FILE`` or ``--root TREE`` judged other instances, so every
output gives each quoted command the run's options its subcommand takes (``TAKES``),
quoted as ``shlex.quote`` does and made printable (the default config file and
``--root /`` add nothing). A problem whose code mps-health documents then ends with
``(runbook: mps-health explain CODE)``. ``commands`` reads the commands back out.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, List, Mapping, Optional, Tuple

from mps_health.model import registry
from mps_health.model.results import CheckRun, Result, is_problem

Options = Tuple[Tuple[str, str], ...]

START = "'mps-health "
# Subcommand -> the run options it takes (the tests check each against its argparse
# definition); one not listed takes none of them (explain).
TAKES = {**dict.fromkeys(("check", "snapshot", "clients", "exporter", "healthcheck",
                          "remediate"), ("--config", "--root")),
         "unit": ("--config",), "ack": ("--config",)}


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


# The characters shlex.quote leaves unquoted (its [\w@%+=:,./-], ASCII).
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def quote(value: str) -> str:
    """``value`` as one shell word, as ``shlex.quote`` writes it (shlex imports ``re``, which
    a check must not; the tests compare the two), made printable as outputs are: a
    control character in a file name shows escaped, never reaches a terminal."""
    from mps_health.model.printable import printable

    if value and all(c in SAFE for c in value):
        return value
    return printable("'" + value.replace("'", "'\"'\"'") + "'")


def with_options(action: str, options: Options) -> str:
    """``action`` with each quoted ``'mps-health SUB ...'`` command given the options
    SUB takes that it does not name already, after its own words."""
    if not options or START not in action:
        return action
    out: List[str] = []
    at = 0
    while True:
        start = action.find(START, at)
        end = action.find("'", start + 1) if start >= 0 else -1
        if end < 0:  # no (closed) command left: the rest as it is
            out.append(action[at:])
            return "".join(out)
        command = action[start + 1:end]
        words = command.split()
        takes = TAKES.get(words[1] if len(words) > 1 else "", ())
        extra = [f"{opt} {quote(value)}" for opt, value in options
                 if opt in takes and opt not in words
                 and not any(w.startswith(opt + "=") for w in words)]
        out.append(action[at:start + 1])
        out.append(" ".join([command, *extra]))
        at = end


RESET = START + "remediate reset "


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
        if not is_problem(r) or RESET not in r.action:
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
    """The runs with every action given the run's options, and every problem's action
    its runbook entry (``any_check``: codes documented whatever check reports them, the
    engine's)."""
    def one(r: Result, ours: bool) -> Result:
        action = with_options(r.action, options)
        if is_problem(r) and (ours or r.code in any_check):  # folded: no action
            action = read_more(action, r.code)
        return r if action == r.action else r._replace(action=action)

    out = []
    for run in runs:
        # mps-health documents a built-in check's codes; a site's own check (named as an
        # importable module) documents its own.
        spec = registry.checks().get(run.name)
        ours = spec is not None and spec.target.startswith(".")
        out.append(run._replace(results=tuple(one(r, ours) for r in run.results)))
    return tuple(out)


def commands(action: str) -> List[str]:
    """The commands an action quotes (``'mps-health ...'``), each a shell command line. A
    word in it may be quoted (``--config '/etc/my site.yaml'``): a quote ends the command
    only where no such word opens (after a space or a closing double quote) and none
    closed just before (``shlex.quote`` never writes two single quotes in a row)."""
    found: List[str] = []
    at = 0
    while True:
        start = action.find(START, at)
        if start < 0:
            return found
        i, inside, before = start + 1, "", " "
        while i < len(action):
            c = action[i]
            if inside:
                if c == inside:
                    inside, before = "", "closed" + c
                else:
                    before = c
            elif c == "'" and before not in (" ", 'closed"'):
                break  # the command's own closing quote
            elif c in "'\"":
                inside = c
            else:
                before = c
            i += 1
        found.append(action[start + 1:i])
        at = i + 1

