"""NHC-style text: a summary line, then one line per problem with what to do.

Lines go unchanged to slurmd, pipes and files. On a terminal (``width`` > 0) a problem is
one short line cut to the width, then what to do on lines of their own (``action_lines``:
wrapped at the width, never inside a command, so each can be pasted); ``-v`` gives every
line whole; ``colour`` paints state names.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator, List, TextIO

from mps_health.engine.actionhints import quoted
from mps_health.model.results import OK, STARTING, STATE_NAMES, Command, Report, Result, is_problem

# SGR colours of each state's name: green, yellow, bold red, magenta.
COLOURS = {"OK": "32", "WARNING": "33", "CRITICAL": "1;31", "UNKNOWN": "35"}
MORE = "-v: every line whole, what is OK, timings"
DO = "  -> "  # what opens a terminal's action line; the lines it wraps onto are indented
NARROWEST = 20  # a width below this (a broken COLUMNS) is taken as this


def problem_line(r: Result) -> str:
    return short_line(r) + (f" -> {r.action}" if r.action else "")


def short_line(r: Result) -> str:
    """What is wrong, without what to do: a terminal's line, cut to its width."""
    where = f"[{r.instance}]" if r.instance else ""
    return f"{STATE_NAMES[r.state]} {r.check}{where} {r.code}: {r.message}"


def ok_line(r: Result) -> str:
    """A result that passed ("OK ..."), or a note in the OK state that is no verdict (its
    own code, e.g. history-not-saved: "NOTE ...")."""
    where = f"[{r.instance}]" if r.instance else ""
    return f"{'OK' if r.code == 'ok' else 'NOTE'} {r.check}{where}: {r.message}"


def passed(report: Report) -> str:
    """"N checks passed on NODE in Ts", N the OK lines ``-v`` lists (a check of many
    instances counts each); check_mps says the same. Notes (``NOTE`` lines: what a user
    other than root cannot save) are no check passed: root and a job's user count alike."""
    n = sum(1 for run in report.runs for r in run.results if r.state == OK and r.code == "ok")
    return f"{n} check{'s' if n != 1 else ''} passed on {report.node} in {report.duration_s:.2f}s"


def gathered(report: Report) -> str:
    """``-v``'s last line: what gathering each fact source took, and the run."""
    spent = ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in sorted(report.gather_s.items()))
    return f"gathered: {spent or 'nothing'}; total {report.duration_s * 1000:.1f}ms"


def folded_line(r: Result) -> str:
    """A finding folded under its cause (-v): said, never advised on, not counted. One
    still starting after boot (``results.starting``) reads INITIALIZING, always shown."""
    where = f"[{r.instance}]" if r.instance else ""
    if r.cause == STARTING:
        return f"INITIALIZING {r.check}{where} {r.code}: {r.message} (the node is booting: " \
            "not counted until healthcheck.boot_grace_s has passed)"
    return f"FOLDED {r.check}{where} {r.code}: {r.message} (follows from {r.cause})"


def counted(labels: Iterable[str], most: int) -> str:
    """``labels`` listed once each, in order of first appearance, a repeated one with its
    count ("pipe-entry-foreign node x3"), at most ``most`` of them and then how many
    more: the counts listed add up to the labels given, as the summary's N says."""
    items = list(Counter(labels).items())  # in order of first appearance, linear
    shown = [f"{label} x{n}" if n > 1 else label for label, n in items[:most]]
    rest = sum(n for _, n in items[most:])
    return ", ".join(shown + ([f"+{rest} more"] if rest else []))


def label(r: Result) -> str:
    return r.code + (f" {r.instance}" if r.instance else "")


def summary_line(report: Report) -> str:
    state = STATE_NAMES[report.state]
    problems = report.problems()
    if not problems:
        return f"MPS {state} - {passed(report)}"
    shown = counted(map(label, problems), 6)
    return f"MPS {state} - {len(problems)} problem{'s' if len(problems) != 1 else ''}: {shown}"


def fit(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters ("..." says it was); 0: as it is."""
    if width <= 0 or len(line) <= width:
        return line
    width = max(width, NARROWEST)
    return line[:width - 3] + "..."


def action_lines(action: str, width: int, commands: Iterable[Command] = ()) -> List[str]:
    """A problem's action on a terminal: wrapped at ``width`` between words, a command it
    quotes (``commands``) never split, so it pastes whole from one line (one wider than
    the terminal is left for the terminal to fold)."""
    import textwrap  # only on a terminal: slurmd's and the pipes' runs do without re

    if not action:
        return []
    # Inside a command its spaces are no place to wrap: \0 stands for them meanwhile.
    kept = action
    for command in map(quoted, commands):
        kept = kept.replace(command, command.replace(" ", "\0"))
    wrapped = textwrap.wrap(kept, max(width, NARROWEST), initial_indent=DO,
                            subsequent_indent=" " * len(DO), break_long_words=False,
                            break_on_hyphens=False)
    return [line.replace("\0", " ") for line in wrapped]


def paint(line: str, state: int, at: int, colour: bool) -> str:
    """``line`` with the state's name at ``at`` in its colour (if still whole there)."""
    name = STATE_NAMES[state]
    if not colour or line[at:at + len(name)] != name:
        return line
    return f"{line[:at]}\x1b[{COLOURS[name]}m{name}\x1b[0m{line[at + len(name):]}"


def lines(report: Report, verbose: bool = False, width: int = 0,
          colour: bool = False) -> Iterator[str]:
    """The output, line by line as ``write`` prints them (a report of many thousand instances
    is never one string); ``width`` and ``colour`` as the module doc says, colour codes
    added after the text from the system was escaped and cut."""
    short = width > 0 and not verbose
    yield paint(fit(summary_line(report), width), report.state, 4, colour)
    for run in report.runs:
        for r in run.results:
            if is_problem(r):
                line = fit(short_line(r), width) if short else problem_line(r)
                yield paint(line, r.state, 0, colour)
                if short:
                    yield from action_lines(r.action, width, r.commands)
            elif r.state != OK:
                if verbose or r.cause == STARTING:
                    yield folded_line(r)
            elif verbose:
                yield paint(ok_line(r), OK, 0, colour)
    if short and report.problems():
        yield fit(MORE, width)
    if verbose:
        yield gathered(report)


def write(report: Report, out: TextIO, verbose: bool = False, width: int = 0,
          colour: bool = False) -> None:
    for line in lines(report, verbose, width, colour):
        out.write(line + "\n")


def render(report: Report, verbose: bool = False) -> str:
    return "\n".join(lines(report, verbose))
