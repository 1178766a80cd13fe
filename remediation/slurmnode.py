"""This node as slurmctld sees it, and draining/resuming it under NHC's rules.

One ``scontrol show node NAME -o`` gives State and Reason (Reason is the last field and
holds spaces; Slurm appends ``[user@time]``). We drain only a node that is in service
and carries no reason of someone else; we resume only a node whose reason's first word
is still our tag, read just before resuming. DOWN, FAIL, maintenance, reboot-pending
and not-responding nodes are left alone. Every scontrol call is bounded; a failure is
reported, never fatal.
"""

from typing import FrozenSet, NamedTuple, Optional, Tuple

from mps_health.config import Config
from mps_health.runner import run

# States where Slurm, or a person, owns what happens to the node next. NOT_RESPONDING is
# not one: it comes and goes with slurmctld's pings (NHC ignores it too), and a node
# that runs us is evidently up.
HANDS_OFF = frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                       "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "UNKNOWN",
                       "FUTURE"})
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})


class NodeView(NamedTuple):
    name: str
    state: str  # as printed: "IDLE+DRAIN", "MIXED+DRAIN+REBOOT_REQUESTED", ...
    flags: FrozenSet[str]  # the words of state: {"IDLE", "DRAIN"}
    reason: str  # without Slurm's trailing "[user@time]"; "" when none


class SlurmCallError(Exception):
    """scontrol failed, hung or answered something unreadable: one line saying which."""


def parse_show_node(text: str) -> NodeView:
    """One node from ``scontrol show node NAME -o``; ValueError if it is not one."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "").strip()
    if not line.startswith("NodeName="):
        raise ValueError(f"not a node record: {line[:80]!r}" if line else "no output")
    at = line.find(" State=")
    if at < 0:
        raise ValueError("the node record has no State=")
    state = line[at + len(" State="):].split(" ", 1)[0]
    reason = ""
    r = line.find(" Reason=", at)
    if r >= 0:
        reason = line[r + len(" Reason="):].strip()
        stamp = reason.rfind(" [")
        if reason.endswith("]") and stamp >= 0 and "@" in reason[stamp:]:
            reason = reason[:stamp].rstrip()
        if reason == "(null)":
            reason = ""
    name = line[len("NodeName="):].split(" ", 1)[0]
    flags = frozenset(w.rstrip("*~#!%$@^-") for w in state.split("+") if w)
    return NodeView(name, state, flags, reason)


def ours(view: NodeView, tag: str) -> bool:
    """Is the reason ours? Its first word is our tag (NHC's rule, with our own tag)."""
    words = view.reason.split(None, 1)
    return bool(words) and words[0] == tag


def may_drain(view: NodeView, tag: str) -> Tuple[bool, str]:
    """(act?, why) for draining: only an in-service node with no reason of another."""
    hands_off = sorted(view.flags & HANDS_OFF)
    if hands_off:
        return False, f"node is {view.state}: left to Slurm and the admins"
    if view.flags & DRAINED:
        if ours(view, tag):
            return False, "already drained by us"
        return False, f"already drained by someone else ({view.reason or 'no reason'}): left alone"
    if view.reason and not ours(view, tag):
        return False, f"carries someone else's reason ({view.reason}): not overwritten"
    return True, f"node is {view.state}"


def may_resume(view: NodeView, tag: str) -> Tuple[bool, str]:
    """(act?, why) for resuming: drained, our tag first, and nothing else holds it."""
    if not view.flags & DRAINED:
        return False, f"node is {view.state}, not drained"
    if not ours(view, tag):
        return False, f"drained by someone else ({view.reason or 'no reason'}): left alone"
    hands_off = sorted(view.flags & HANDS_OFF)
    if hands_off:
        return False, f"node is {view.state}: left to Slurm and the admins"
    return True, f"drained by us ({view.reason})"


def reason_text(tag: str, code: str, text: str, limit: int = 120) -> str:
    """'MPS-HC: control-wedged gpu0: the control daemon did not answer...' (one line)."""
    body = " ".join(f"{code} {text}".split())
    full = f"{tag} {body}"
    return full if len(full) <= limit else full[:limit - 3].rstrip() + "..."


def _scontrol(config: Config, args: Tuple[str, ...], timeout_s: float) -> str:
    done = run([config.command("scontrol"), *args], timeout_s)
    if done.exec_error:
        raise SlurmCallError(done.exec_error)
    if done.timed_out:
        raise SlurmCallError(f"scontrol {args[0]} did not answer within {timeout_s:g}s "
                             "(slurmctld down or unreachable?)")
    if done.rc != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.rc}")
        raise SlurmCallError(f"scontrol {args[0]} failed: {said.splitlines()[0]}")
    return done.stdout


def read_node(config: Config, node: str, timeout_s: float) -> NodeView:
    text = _scontrol(config, ("show", "node", node, "-o"), timeout_s)
    try:
        return parse_show_node(text)
    except ValueError as e:
        raise SlurmCallError(f"scontrol show node {node}: {e}") from None


def drain(config: Config, node: str, reason: str, timeout_s: float) -> None:
    _scontrol(config, ("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"),
              timeout_s)


def resume(config: Config, node: str, timeout_s: float) -> None:
    _scontrol(config, ("update", f"NodeName={node}", "State=RESUME"), timeout_s)


def drain_if_allowed(config: Config, node: str, tag: str, reason: str, timeout_s: float
                     ) -> Tuple[str, str, Optional[NodeView]]:
    """Read, decide, drain: ("drained" | "already" | "left" | "error", why, view)."""
    try:
        view = read_node(config, node, timeout_s)
    except SlurmCallError as e:
        return "error", str(e), None
    allowed, why = may_drain(view, tag)
    if not allowed:
        return ("already" if why == "already drained by us" else "left"), why, view
    try:
        drain(config, node, reason, timeout_s)
    except SlurmCallError as e:
        return "error", str(e), view
    return "drained", why, view


def resume_if_ours(config: Config, node: str, tag: str, timeout_s: float
                   ) -> Tuple[str, str, Optional[NodeView]]:
    """Read (just before), decide, resume: ("resumed" | "left" | "error", why, view)."""
    try:
        view = read_node(config, node, timeout_s)
    except SlurmCallError as e:
        return "error", str(e), None
    allowed, why = may_resume(view, tag)
    if not allowed:
        return "left", why, view
    try:
        resume(config, node, timeout_s)
    except SlurmCallError as e:
        return "error", str(e), view
    return "resumed", why, view
