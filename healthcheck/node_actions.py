"""``remediate drain`` and ``remediate resume``: the health check's tag rules, by hand.

drain: only a node in service with no reason of someone else; the reason is
``MPS-HC: manual: TEXT``. resume: only a node whose reason still starts with our tag,
read just before resuming; it also clears the health check's memory of its own drain
(the counts start again), so the next failing run is judged afresh.
"""

import contextlib
import os

from mps_health.config.load import Config
from mps_health.config.remediation import remediation
from mps_health.config.slurm import settings as slurm_settings
from mps_health.healthcheck import slurmnode
from mps_health.healthcheck import state as hcstate
from mps_health.probes.context import Context, node_name
from mps_health.remediation.actions import CANNOT, DONE, FAILED, REFUSED, Say, audit_for, lock_node


def run(config: Config, root: str, action: str, text: str, dry_run: bool, say: Say) -> int:
    slurm = slurm_settings(config)
    tag, timeout_s = slurm.drain_tag, slurm.timeout_s
    settings = remediation(config)
    ctx = Context(config, root)
    node = node_name(config)
    reason = slurmnode.reason_text(tag, "manual:", text or "manual")
    say(f"{action} {node}" + (f" with reason '{reason}'" if action == "drain" else
                              f" if its reason starts with '{tag}'"))
    if dry_run:
        try:
            now = slurmnode.read_node(config, node, timeout_s)
        except slurmnode.SlurmError as e:
            say(f"  cannot read the node: {e}")
            return CANNOT
        allowed, why = (slurmnode.may_drain(now, tag) if action == "drain"
                        else slurmnode.may_resume(now, tag))
        say(f"  now: State={now.state} Reason={now.reason or '(none)'}")
        say(f"  would {'' if allowed else 'not '}{action}: {why}")
        say("  dry run: nothing was changed")
        return DONE
    with lock_node(ctx, settings, f"{action} {node}"):
        if action == "drain":
            outcome, why, view = slurmnode.drain_if_allowed(config, node, tag, reason, timeout_s)
        else:
            outcome, why, view = slurmnode.resume_if_ours(config, node, tag, timeout_s)
            if outcome == "resumed":
                _forget_drain(ctx)
    if view is not None:
        say(f"  was: State={view.state} Reason={view.reason or '(none)'}")
    said, code = {"drained": (outcome, DONE), "resumed": (outcome, DONE),
                  "already": ("nothing to do", DONE), "left": ("refused", REFUSED)
                  }.get(outcome, ("FAILED", FAILED))
    result = {DONE: "ok", REFUSED: "refused"}.get(code, "failed")
    audit_for(ctx, settings, action).record(action, result, node_reason=reason
                                            if action == "drain" else "", detail=why)
    say(f"  {said}: {why}")
    return code


def _forget_drain(ctx: Context) -> None:
    path = os.path.join(ctx.path(ctx.config.state_dir), hcstate.STATE_FILE)
    with contextlib.suppress(OSError):  # the health check then re-learns from Slurm
        hcstate.save(path, hcstate.HcState())
