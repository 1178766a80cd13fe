"""NHC-style text: a summary line, then one line per problem with what to do."""

from __future__ import annotations

from ..core.results import OK, STATE_NAMES, Report, Result, is_problem

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds on the check slurmd runs
    from typing import Iterator, TextIO


def problem_line(r: Result) -> str:
    where = f"[{r.instance}]" if r.instance else ""
    line = f"{STATE_NAMES[r.state]} {r.check}{where} {r.code}: {r.message}"
    return line + (f" -> {r.action}" if r.action else "")


def folded_line(r: Result) -> str:
    """A finding folded under its cause (-v): said, never advised on, not counted."""
    where = f"[{r.instance}]" if r.instance else ""
    return f"FOLDED {r.check}{where} {r.code}: {r.message} (follows from {r.cause})"


def summary_line(report: Report) -> str:
    state = STATE_NAMES[report.state]
    problems = report.problems()
    checks = len(report.runs)
    if not problems:
        return (f"MPS {state} - {checks} checks passed on {report.node} "
                f"in {report.duration_s:.2f}s")
    # Distinct labels in order of first appearance: a dict, so many problems stay linear.
    codes = list(dict.fromkeys(r.code + (f" {r.instance}" if r.instance else "")
                               for r in problems))
    shown = ", ".join(codes[:6]) + (f", +{len(codes) - 6} more" if len(codes) > 6 else "")
    return f"MPS {state} - {len(problems)} problem{'s' if len(problems) != 1 else ''}: {shown}"


def lines(report: Report, verbose: bool = False) -> Iterator[str]:
    """The output, line by line (``write`` prints them as they come: a report of many
    thousand instances is never held as one string)."""
    yield summary_line(report)
    for run in report.runs:
        for r in run.results:
            if is_problem(r):
                yield problem_line(r)
            elif r.state != OK:
                if verbose:
                    yield folded_line(r)
            elif verbose:
                where = f"[{r.instance}]" if r.instance else ""
                yield f"OK {r.check}{where}: {r.message}"
    if verbose:
        spent = ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in sorted(report.gather_s.items()))
        yield f"gathered: {spent or 'nothing'}; total {report.duration_s * 1000:.1f}ms"


def write(report: Report, out: TextIO, verbose: bool = False) -> None:
    for line in lines(report, verbose):
        out.write(line + "\n")


def render(report: Report, verbose: bool = False) -> str:
    return "\n".join(lines(report, verbose))
