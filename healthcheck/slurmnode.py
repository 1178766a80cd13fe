"""This node as slurmctld sees it, and draining/resuming it under NHC's rules.

Read by ``probes.slurm.read_node`` (State, and Reason without Slurm's ``[user@time]``);
scontrol called by ``probes.slurm.call``, bounded, a failure reported, never fatal. We
drain only a node in service (not drained by anyone, not held by Slurm: ``HANDS_OFF``);
we resume only a node whose reason's first word is still our tag, read just before. A
Reason on a node in service is history (Slurm 24.11 keeps the last one after RESUME,
22.05 clears it), not someone's hold: it never stops a drain.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from mps_health.config.load import Config
from mps_health.model.printable import printable
from mps_health.model.results import CRITICAL, Result
from mps_health.probes.slurm import (
    SlurmError,
    SlurmNode,
    call,
    read_node,
    read_nodes,
    scontrol_argv,
)

# Decides, on every node slurmctld knows, whether a drain may go ahead: "" yes, or
# why not.
Breaker = Callable[[Sequence[SlurmNode]], str]

# States where Slurm, or a person, owns what happens to the node next. NOT_RESPONDING is
# not one: it comes and goes with slurmctld's pings (NHC ignores it too), and a node
# that runs us is evidently up.
HANDS_OFF = frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                       "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "UNKNOWN",
                       "FUTURE"})
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})

# Findings that any local user can cause with their own processes, with entries in the
# public pipe and log dirs, or with their own job's clients. They are reported, and they
# never drain, whatever ``healthcheck.drain_on`` says: a plain user must not be able to
# take a node out of service.
BY_ANY_USER = frozenset({
    "mps-impostor", "server-unclaimed", "server-stopped-foreign", "daemon-foreign",
    "daemon-unexpected",
    "pipe-entry-foreign", "log-entry-foreign", "log-file-bad", "client-job-mismatch",
    "client-not-mps-job", "client-over-limit", "clients-near-cap", "orphan-dir",
    "orphan-daemon", "orphan-unrecorded", "limits-not-in-force", "pinned-limit-ambiguous",
    "pinned-limit-unknown-device", "blocked-connection", "blocked-server",
    "blocked-foreign-server", "blocker-repeated",
})
# Codes that are a user's doing unless CRITICAL: a per-job server no daemon was seen
# with (held, traced, its binary unread) is a WARNING of the same code.
BY_ANY_USER_UNLESS_CRITICAL = frozenset({"orphan-server"})
# Drains the fleet circuit breaker does not count. Besides the above, an MPS entry of
# the wrong owner or kind in the pipe dir does break MPS (clients may reach a user's
# socket), so it drains, but a user can plant it on many nodes at once: counting those
# drains would let that user hold back the drain of a node with a real fault.
NOT_COUNTED = BY_ANY_USER | {"pipe-entry-owner", "pipe-entry-bad"}




def by_any_user(result: Result) -> bool:
    """Could any local user have caused this finding? (Then it never drains.)"""
    return result.code in BY_ANY_USER or (
        result.code in BY_ANY_USER_UNLESS_CRITICAL and result.state != CRITICAL)


def reason_code(reason: str, tag: str) -> str:
    """The finding code in a reason we wrote ('MPS-HC: control-wedged gpu0: ...'), or ""."""
    words = reason.split(None, 2)
    return words[1].rstrip(":") if len(words) >= 2 and words[0] == tag else ""


def may_drain(view: SlurmNode, tag: str) -> Tuple[bool, str]:
    """(act?, why) for draining: only a node in service."""
    if HANDS_OFF.intersection(view.flags):
        return False, f"node is {view.state}: left to Slurm and the admins"
    if DRAINED.intersection(view.flags):
        return False, "already drained by us" if view.reason_is(tag) else \
            f"already drained by someone else ({view.reason or 'no reason'}): left alone"
    if view.reason and not view.reason_is(tag):
        return True, f"node is {view.state} (its reason '{view.reason}' is left from an " \
            "earlier drain)"
    return True, f"node is {view.state}"


def may_resume(view: SlurmNode, tag: str) -> Tuple[bool, str]:
    """(act?, why) for resuming: drained, our tag first, and nothing else holds it."""
    if not DRAINED.intersection(view.flags):
        return False, f"node is {view.state}, not drained"
    if not view.reason_is(tag):
        return False, f"drained by someone else ({view.reason or 'no reason'}): left alone"
    if HANDS_OFF.intersection(view.flags):
        return False, f"node is {view.state}: left to Slurm and the admins"
    return True, f"drained by us ({view.reason})"


def reason_text(tag: str, code: str, text: str, limit: int = 120) -> str:
    """'MPS-HC: control-wedged gpu0: the control daemon did not answer...' (one line)."""
    body = printable(" ".join(f"{code} {text}".split()))
    full = f"{tag} {body}"
    return full if len(full) <= limit else full[:limit - 3].rstrip() + "..."


def fleet_breaker(me: str, tag: str, max_share: float, max_nodes: Optional[int]) -> Breaker:
    """The circuit breaker: a drain waits when, in the partitions ``me`` is in, more than
    ``max_nodes`` nodes or more than ``max_share`` of the nodes already carry our tag
    (NVSentinel's rule: a fault that many nodes share is the fleet's, not the node's).
    Drains for a cause in ``NOT_COUNTED`` are not counted."""
    def judge(nodes: Sequence[SlurmNode]) -> str:
        mine = next((n for n in nodes if n.name == me), None)
        parts = set(mine.partitions) if mine is not None else set()
        peers = [n for n in nodes if parts.intersection(n.partitions)] if parts else list(nodes)
        ours_now = [n for n in peers if n.name != me and DRAINED.intersection(n.flags)
                    and n.reason_is(tag) and reason_code(n.reason, tag) not in NOT_COUNTED]
        size = max(1, len(peers))
        where = f"partition {','.join(sorted(parts))}" if parts else "the cluster"
        over = (max_nodes is not None and len(ours_now) > max_nodes) or \
            len(ours_now) / size > max_share
        if not over:
            return ""
        limit = f"limit {max_nodes} nodes or {max_share:.0%}" if max_nodes is not None \
            else f"limit {max_share:.0%}"
        return (f"fleet-wide fault suspected: {len(ours_now)} of {size} nodes of {where} "
                f"already drained by {tag} ({limit}); this node is not drained")
    return judge


def drain_if_allowed(config: Config, node: str, tag: str, reason: str, timeout_s: float,
                     breaker: Optional[Breaker] = None
                     ) -> Tuple[str, str, Optional[SlurmNode]]:
    """Read, decide, drain: ("drained" | "already" | "left" | "held" | "error", why, view).
    ``breaker`` costs one more call (every node), only when about to drain."""
    return _update(config, node, tag, timeout_s, may_drain, breaker, "drained",
                   "State=DRAIN", f"Reason={reason}")


def resume_if_ours(config: Config, node: str, tag: str, timeout_s: float
                   ) -> Tuple[str, str, Optional[SlurmNode]]:
    """Read (just before), decide, resume: ("resumed" | "left" | "error", why, view)."""
    return _update(config, node, tag, timeout_s, may_resume, None, "resumed", "State=RESUME")


def _update(config: Config, node: str, tag: str, timeout_s: float,
            may: Callable[[SlurmNode, str], Tuple[bool, str]], breaker: Optional[Breaker],
            done: str, *fields: str) -> Tuple[str, str, Optional[SlurmNode]]:
    try:
        view = read_node(config, node, timeout_s)
    except SlurmError as e:
        return "error", str(e), None
    allowed, why = may(view, tag)
    if not allowed:
        return ("already" if why == "already drained by us" else "left"), why, view
    if breaker is not None:
        try:
            held = breaker(read_nodes(config, timeout_s))
        except SlurmError as e:
            return "error", f"cannot count the drained nodes of the partition: {e}", view
        if held:
            return "held", held, view
    try:
        call(scontrol_argv(config, "update", f"NodeName={node}", *fields), timeout_s,
             "scontrol update")
    except SlurmError as e:
        return "error", str(e), view
    return done, why, view
