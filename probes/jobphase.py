"""When a per-job MPS instance is judged: never while its job's MPS is set up or torn down.

The Prolog makes a job's dirs, then starts its daemon; the Epilog quits it, then removes
the dirs. In between, a check would see ``control-absent`` or a missing pipe dir: false
alarms that drain nodes under job churn. So a per-job instance is judged only when
``squeue`` lists its job RUNNING (CONFIGURING: the Prolog runs; COMPLETING: the Epilog)
for at least ``slurm.job_grace_s``, and no hook of ours is changing its MPS: each records
its step in ``planned.py`` *before* it acts, and a newest record that is a tear-down, a
"prolog start" (for at most ``PROLOG_LIMIT_S`` or the grace), or made since the run
began, means not judged. The records are read again once every fact is in.

Not judged is not hidden: gres-drift says the job's MPS is being set up or torn down,
and orphans names dirs an Epilog leaves once Slurm no longer lists the job.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

from mps_health.model.facts import Instance
from mps_health.probes.context import Context

if TYPE_CHECKING:
    from mps_health.model.facts_deep import PlannedRestart
    from mps_health.model.slurm_facts import SlurmJob

SETUP_START = "prolog start"
SETUP_DONE = "prolog"
TEARDOWN = ("epilog", "prolog undo")
HOOK_STEPS = (SETUP_START, SETUP_DONE, *TEARDOWN)
# Job states (squeue %T) in which the Epilog runs or has run.
ENDING = ("COMPLETING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
          "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
# A Prolog that recorded its start has this long to record its end or its undoing (one
# killed on the way leaves its start as the newest record; then the instance is judged).
PROLOG_LIMIT_S = 300.0
SET_UP = "its MPS is being set up"
TORN_DOWN = "its MPS is being torn down"


def slurm_phase(job: Optional[SlurmJob], grace_s: float) -> str:
    """'' when Slurm's view lets the job's instance be judged, else why not."""
    if job is None:
        return "Slurm does not run its job here"
    if job.state == "CONFIGURING":
        return SET_UP
    if job.state != "RUNNING":
        return TORN_DOWN if job.state in ENDING else f"its job is {job.state.lower()}"
    if job.elapsed_s is None or job.elapsed_s < grace_s:
        return SET_UP
    return ""


def hook_phase(records: Sequence[PlannedRestart], pipe_dir: str, since: Optional[float],
               now: float, grace_s: float) -> str:
    """'' when no hook of ours is changing the instance's MPS, else why not. ``since``: when
    this run began (None before any fact is gathered)."""
    pipe_dir = os.path.normpath(pipe_dir)
    mine = [r for r in records if r.pipe_dir == pipe_dir and r.by in HOOK_STEPS]
    if not mine:
        return ""
    newest = max(mine, key=lambda r: r.at)
    if newest.by in TEARDOWN:
        return TORN_DOWN
    if newest.by == SETUP_START and now - newest.at < max(grace_s, PROLOG_LIMIT_S):
        return SET_UP
    if since is not None and newest.at >= since:
        return SET_UP
    return ""


def unjudged(ctx: Context, insts: Tuple[Instance, ...], since: Optional[float]
             ) -> Dict[str, str]:
    """Per-job instances not to judge now, by name, with why (see the module's rules)."""
    from mps_health.config.slurm import settings
    from mps_health.hostio.planned import load

    per_job = [i for i in insts if i.layout == "per-job"]
    if not per_job:
        return {}
    grace = settings(ctx.config).job_grace_s
    jobs = {j.job_id: j for j in (ctx.jobs.jobs or ())} if ctx.jobs is not None else {}
    records, _error = load(ctx.path(ctx.config.state_dir))  # unreadable: Slurm's view only
    now = time.time()
    return {inst.name: why for inst in per_job
            if (why := slurm_phase(jobs.get(inst.job_id or ""), grace)
                or hook_phase(records, inst.pipe_dir, since, now, grace))}
