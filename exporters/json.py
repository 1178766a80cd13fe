"""JSON: the whole report, for Ansible, support bundles and scripts.

Written by ``json.dump`` as it encodes, so the text is never held whole: the lists of
problems and results are generators, each made a list (``default``) only when its turn
comes.
"""

import json
from typing import Any, Dict, TextIO

from mps_health.model.results import STARTING, STATE_NAMES, CheckRun, Report, Result, is_problem


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
    """The report as JSON-able data, its long lists as generators (``write`` takes them).
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


def write(report: Report, out: TextIO) -> None:
    """The report as JSON on ``out``, and a newline."""
    json.dump(document(report), out, indent=2, default=list)
    out.write("\n")
