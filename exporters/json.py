"""JSON: the whole report, for Ansible, support bundles and scripts."""

import json
from typing import Any, Dict

from mps_health.results import STATE_NAMES, Report


def as_dict(report: Report) -> Dict[str, Any]:
    return {
        "node": report.node,
        "state": STATE_NAMES[report.state],
        "exit_code": report.state,
        "version": report.version,
        "started_at": report.started_at,
        "duration_s": round(report.duration_s, 6),
        "gather_s": {k: round(v, 6) for k, v in report.gather_s.items()},
        "problems": [
            {"check": r.check, "instance": r.instance, "state": STATE_NAMES[r.state],
             "code": r.code, "message": r.message, "action": r.action}
            for r in report.problems()
        ],
        "checks": [
            {
                "name": run.name,
                "state": STATE_NAMES[run.state],
                "duration_s": round(run.duration_s, 6),
                "error": run.error,
                "results": [
                    {"instance": r.instance, "state": STATE_NAMES[r.state], "code": r.code,
                     "message": r.message, "action": r.action, "values": dict(r.values)}
                    for r in run.results
                ],
            }
            for run in report.runs
        ],
    }


def render(report: Report) -> str:
    return json.dumps(as_dict(report), indent=2, sort_keys=False)
