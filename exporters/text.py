"""NHC-style text: a summary line, then one line per problem with what to do."""

from __future__ import annotations

from mps_health.results import OK, STATE_NAMES, Report, Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List


def problem_line(r: Result) -> str:
    where = f"[{r.instance}]" if r.instance else ""
    line = f"{STATE_NAMES[r.state]} {r.check}{where} {r.code}: {r.message}"
    return line + (f" -> {r.action}" if r.action else "")


def summary_line(report: Report) -> str:
    state = STATE_NAMES[report.state]
    problems = report.problems()
    checks = len(report.runs)
    if not problems:
        return (f"MPS {state} - {checks} checks passed on {report.node} "
                f"in {report.duration_s:.2f}s")
    codes: List[str] = []
    for r in problems:
        label = f"{r.code}" + (f" {r.instance}" if r.instance else "")
        if label not in codes:
            codes.append(label)
    shown = ", ".join(codes[:6]) + (f", +{len(codes) - 6} more" if len(codes) > 6 else "")
    return f"MPS {state} - {len(problems)} problem{'s' if len(problems) != 1 else ''}: {shown}"


def render(report: Report, verbose: bool = False) -> str:
    lines = [summary_line(report)]
    for run in report.runs:
        for r in run.results:
            if r.state != OK:
                lines.append(problem_line(r))
            elif verbose:
                where = f"[{r.instance}]" if r.instance else ""
                lines.append(f"OK {r.check}{where}: {r.message}")
    if verbose:
        spent = ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in sorted(report.gather_s.items()))
        lines.append(f"gathered: {spent or 'nothing'}; total {report.duration_s * 1000:.1f}ms")
    return "\n".join(lines)
