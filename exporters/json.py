"""JSON: the whole report, for Ansible, support bundles and scripts.

Written piece by piece: the lists of problems and results are generators, encoded one item
at a time, so a report of many thousand instances never exists twice in memory. The text
is what ``json.dumps(..., indent=2)`` gives for the same document.
"""

import json
from typing import Any, Dict, Iterator, TextIO

from mps_health.model.results import STARTING, STATE_NAMES, CheckRun, Report, Result, is_problem

INDENT = "  "
_ENCODER = json.JSONEncoder(indent=len(INDENT))  # one, not one per item (json.dumps)


def _result(r: Result) -> Dict[str, Any]:
    found = {"instance": r.instance, "state": STATE_NAMES[r.state], "code": r.code,
             "message": r.message, "action": r.action, "values": dict(r.values)}
    if r.cause:  # folded under its cause: not among the problems, not counted
        found["cause"] = r.cause
    return found


def _problem(r: Result) -> Dict[str, Any]:
    return {"check": r.check, "instance": r.instance, "state": STATE_NAMES[r.state],
            "code": r.code, "message": r.message, "action": r.action}


def _run(run: CheckRun) -> Dict[str, Any]:
    return {"name": run.name, "state": STATE_NAMES[run.state],
            "duration_s": round(run.duration_s, 6), "error": run.error,
            "results": (_result(r) for r in run.results)}


def document(report: Report) -> Dict[str, Any]:
    """The report as JSON-able data, its long lists as generators (``encode`` takes them).
    Within the boot grace, what is still starting is listed under ``starting`` (only
    then: the key is absent otherwise), not among the problems."""
    booting = [{"check": r.check, "instance": r.instance, "state": STARTING, "code": r.code,
                "message": r.message} for run in report.runs for r in run.results
               if r.cause == STARTING]
    return {
        "node": report.node,
        "state": STATE_NAMES[report.state],
        "exit_code": report.state,
        "version": report.version,
        "started_at": report.started_at,
        "duration_s": round(report.duration_s, 6),
        "gather_s": {k: round(v, 6) for k, v in report.gather_s.items()},
        "problems": (_problem(r) for run in report.runs for r in run.results if is_problem(r)),
        **({"starting": booting} if booting else {}),
        "checks": (_run(run) for run in report.runs),
    }


def encode(value: Any, level: int = 0) -> Iterator[str]:
    """``value`` as indented JSON text, in pieces: a generator is written as a list, item
    by item; a dict holding one is opened here; anything else goes to ``json.dumps``."""
    pad, inner = INDENT * level, INDENT * (level + 1)
    if isinstance(value, Iterator):
        sep = "["
        for item in value:
            yield f"{sep}\n{inner}"
            yield from encode(item, level + 1)
            sep = ","
        yield "[]" if sep == "[" else f"\n{pad}]"
    elif isinstance(value, dict) and any(isinstance(v, Iterator) for v in value.values()):
        sep = "{"
        for key, item in value.items():
            yield f"{sep}\n{inner}{json.dumps(key)}: "
            yield from encode(item, level + 1)
            sep = ","
        yield f"\n{pad}}}"
    else:
        text = _ENCODER.encode(value)
        yield text.replace("\n", "\n" + pad) if level and "\n" in text else text


def write(report: Report, out: TextIO) -> None:
    """The report as JSON on ``out``, and a newline."""
    for piece in encode(document(report)):
        out.write(piece)
    out.write("\n")
