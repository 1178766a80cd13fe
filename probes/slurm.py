"""Slurm's view of this node, and the one way mps-health calls and reads Slurm.

Every ``scontrol``/``squeue`` call goes through ``call``/``answer``: bounded, no shell, a
failure is ``SlurmError`` (code, one line); slurmctld down or hanging is an error line
after ``slurm.timeout_s``, never a hang. A run reads one ``scontrol -d show node NODE -o``
(``-d`` adds GresUsed; ``-o`` puts Reason last) on every Slurm version: on 22.05 and
24.11 its facts are those of ``scontrol --json`` (compared on one cluster state), so one
reader serves all. The per-job layout's ``squeue`` runs alongside.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mps_health.hostio.runner import Completed, Pending, child_env, run, wait_all
from mps_health.model.slurm_facts import GresItem, JobList, SlurmFacts, SlurmJob, SlurmNode
from mps_health.probes.context import Context, node_name
from mps_health.probes.hostlist import ParseError, parse_count, range_items, split_top

if TYPE_CHECKING:
    from mps_health.config.load import Config

SQUEUE_FORMAT = "%A|%u|%U|%T|%M|%b"  # job id, user, uid, state, time used, gres per node


# --- pure parsers ---------------------------------------------------------------------

def parse_indices(text: str) -> Tuple[int, ...]:
    """``0-1,3`` into (0, 1, 3); ``N/A`` into ()."""
    t = text.strip()
    return () if t in ("N/A", "") else tuple(
        int(i) for i in range_items(t, f"GRES index list {t!r}", 4097))


def parse_gres_item(text: str) -> GresItem:
    """``name[:type][:count][(detail)]`` as Slurm prints a node's Gres or GresUsed."""
    body, detail = text.strip(), ""
    if body.endswith(")") and not body.endswith("(null)") and "(" in body:
        open_at = body.rindex("(")  # the last group: "(null)" may stand before it as a type
        body, detail = body[:open_at], body[open_at + 1:-1]
    if "(" in body.replace("(null)", "") or ")" in body.replace("(null)", ""):
        raise ParseError(f"bad GRES {text!r}")
    parts = body.split(":")
    if not parts[0] or not all(c.isalnum() or c in "_-" for c in parts[0]):
        raise ParseError(f"bad GRES name in {text!r}")
    if len(parts) > 3:
        raise ParseError(f"too many ':' in GRES {text!r}")
    if len(parts) == 2 and parts[1][:1].isdigit():
        parts.insert(1, "")  # name:count
    gtype = parts[1] if len(parts) > 1 and parts[1] not in ("(null)", "") else None
    count = parse_count(parts[2], "GRES count ") if len(parts) == 3 else 1
    indices: Optional[Tuple[int, ...]] = None
    per_device: Optional[Tuple[Tuple[int, int], ...]] = None
    if detail.startswith("IDX:"):
        indices = parse_indices(detail[4:])
    elif "/" in detail:  # 23.11+ shared GRES: used/total per device, in index order
        slots = [slot.partition("/") for slot in detail.split(",")]
        if not all(used.isdigit() and total.isdigit() for used, _, total in slots):
            raise ParseError(f"bad per-device usage {detail!r} in {text!r}")
        per_device = tuple((int(used), int(total)) for used, _, total in slots)
        indices = tuple(i for i, (used, _) in enumerate(per_device) if used > 0)
    elif detail and not detail.startswith("S:"):
        raise ParseError(f"unknown GRES detail ({detail}) in {text!r}")
    return GresItem(parts[0], gtype, count, indices, per_device)


def parse_gres(text: str) -> Tuple[GresItem, ...]:
    """A node's ``Gres=`` or ``GresUsed=`` value (``(null)`` and empty are no GRES)."""
    t = text.strip()
    return () if t in ("", "(null)", "N/A") else tuple(
        parse_gres_item(p) for p in split_top(t) if p.strip())


def parse_fields(line: str) -> Mapping[str, str]:
    """``Key=Value`` pairs of one ``scontrol ... -o`` line; Reason= takes the rest."""
    line, sep, reason = line.partition(" Reason=")
    fields = {"Reason": reason.strip()} if sep else {}
    key = None
    for word in line.split():
        k, sep, v = word.partition("=")
        if sep and k and (k[0].isalpha() and all(c.isalnum() or c in "_:/" for c in k)):
            key = k
            fields[key] = v
        elif key is not None:
            fields[key] += " " + word  # a value with spaces, e.g. OS=Linux 6.1 #1 SMP
        else:
            raise ParseError(f"'{word[:40]}' before any Key=Value")
    return fields


def _node(name: str, state: str, reason: str, gres: str, used: Optional[str],
          version: Optional[str], partitions: Sequence[str] = ()) -> SlurmNode:
    """The node; its Reason without Slurm's ``[user@time]`` suffix (``(null)``: none)."""
    words = state.replace("*", "+NOT_RESPONDING").split("+")
    flags = tuple(dict.fromkeys(w.rstrip("~#!%$@^-") for w in words if w.rstrip("~#!%$@^-")))
    reason = reason.strip()
    stamp = reason.rfind(" [")
    if reason.endswith("]") and stamp >= 0 and "@" in reason[stamp:]:
        reason = reason[:stamp].rstrip()
    return SlurmNode(name, state, flags, "" if reason == "(null)" else reason, parse_gres(gres),
                     None if used is None else parse_gres(used), version,
                     tuple(p for p in partitions if p and p != "(null)"))


def parse_node_line(text: str) -> SlurmNode:
    """The node of ``scontrol [-d] show node NODE -o`` (one line)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise ParseError(f"expected one node line, got {len(lines)}")
    return parse_node_lines(lines[0])[0]


def parse_node_lines(text: str) -> Tuple[SlurmNode, ...]:
    """Every node of ``scontrol show node -o`` (one line each)."""
    nodes: List[SlurmNode] = []
    for line in filter(str.strip, text.splitlines()):
        if not line.startswith("NodeName="):
            raise ParseError(f"not a node record: {line.strip()[:80]!r} (no NodeName=)")
        fields = parse_fields(line)
        if "State" not in fields:
            raise ParseError("the node record has no State=")
        nodes.append(_node(fields["NodeName"], fields["State"], fields.get("Reason", ""),
                           fields.get("Gres", ""), fields.get("GresUsed"), fields.get("Version"),
                           fields.get("Partitions", "").split(",")))
    return tuple(nodes)


def parse_elapsed(text: str) -> Optional[float]:
    """squeue's ``%M`` (``[days-][hours:]minutes:seconds``) in seconds; None if not a time."""
    days, sep, t = text.strip().partition("-")
    parts = (t if sep else days).split(":")
    if (sep and not days.isdigit()) or not 2 <= len(parts) <= 3 \
            or not all(p.isdigit() for p in parts):
        return None
    seconds = functools.reduce(lambda total, p: total * 60 + int(p), parts, 0)
    return float(seconds + (int(days) * 86400 if sep else 0))


def parse_squeue(text: str) -> Tuple[SlurmJob, ...]:
    """Lines of ``squeue -h -o SQUEUE_FORMAT``; a garbled line is an error, never skipped
    (a missing job would make its per-job instance look orphaned)."""
    jobs: List[SlurmJob] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.strip().split("|")]
        if len(fields) != 6 or not fields[0].isdigit() or not fields[2].isdigit():
            raise ParseError(f"squeue line {number} is not 'JOBID|USER|UID|STATE|TIME|GRES': "
                             f"{line[:80]!r}")
        job, user, uid, state, elapsed, gres = fields
        jobs.append(SlurmJob(job, user, int(uid), state, parse_elapsed(elapsed),
                             "" if gres in ("N/A", "(null)") else gres))
    return tuple(jobs)


def classify_failure(done: Completed, what: str, timeout_s: float) -> Tuple[str, str]:
    """(code, one line) for a Slurm command that gave no usable answer."""
    if done.exec_error:
        return "exec-failed", done.exec_error
    if done.timed_out:
        return "timeout", (f"{what} did not answer within {timeout_s:g}s: slurmctld is down, "
                           "unreachable or overloaded")
    err = (done.stderr.strip() or done.stdout.strip()).splitlines()
    first = err[0] if err else f"exit status {done.rc}"
    # Slurm's commands name themselves ("squeue: error: ..."): said once, as ``what``.
    first = first.removeprefix(what.split(" ", 1)[0] + ": ")
    if "Unable to contact slurm controller" in first:
        return "unreachable", f"{what}: {first}"
    if "not found" in first or "Invalid node name" in first:
        return "node-unknown", f"{what}: {first}"
    return "error", f"{what}: {first}"


# --- calling ------------------------------------------------------------------------

class SlurmError(Exception):
    """A Slurm command gave no usable answer: ``code`` (``classify_failure``'s) and a line."""

    def __init__(self, code: str, line: str) -> None:
        super().__init__(line)
        self.code = code


def answer(done: Completed, what: str, timeout_s: float) -> str:
    """The stdout of a Slurm command that succeeded; SlurmError otherwise."""
    if done.rc != 0:
        raise SlurmError(*classify_failure(done, what, timeout_s))
    return done.stdout


def call(argv: Sequence[str], timeout_s: float, what: str,
         env: Optional[Mapping[str, str]] = None) -> str:
    """Run one Slurm command, bounded; its stdout, or SlurmError saying what went wrong."""
    return answer(run(argv, timeout_s, env=env), what, timeout_s)


def scontrol_argv(config: Config, *args: str) -> List[str]:
    return [config.command("scontrol"), *args]


def squeue_argv(config: Config, node: str) -> List[str]:
    return [config.command("squeue"), "-h", "-w", node, "-o", SQUEUE_FORMAT]


def parsed(done: Completed, what: str, timeout_s: float, parse: Callable[[str], Any]) -> Any:
    """``parse`` of ``answer``; a parse failure is SlurmError "parse" too."""
    text = answer(done, what, timeout_s)
    try:
        return parse(text)
    except ParseError as e:
        raise SlurmError("parse", f"{what}: {e}") from None


def read_node(config: Config, node: str, timeout_s: float) -> SlurmNode:
    """This node as slurmctld sees it now (for actions that decide on it); SlurmError."""
    return parsed(run(scontrol_argv(config, "show", "node", node, "-o"), timeout_s),
                  f"scontrol show node {node}", timeout_s, parse_node_line)


def read_nodes(config: Config, timeout_s: float) -> Tuple[SlurmNode, ...]:
    """Every node slurmctld knows (the circuit breaker asks once, just before a drain)."""
    return parsed(run(scontrol_argv(config, "show", "node", "-o"), timeout_s),
                  "scontrol show node", timeout_s, parse_node_lines)


def read_jobs(config: Config, node: str, timeout_s: float) -> Dict[str, SlurmJob]:
    """Every job Slurm places on ``node``, by id; SlurmError if that cannot be known."""
    return parsed(run(squeue_argv(config, node), timeout_s), "squeue", timeout_s,
                  lambda text: {j.job_id: j for j in parse_squeue(text)})


def with_jobs(ctx: Context) -> Context:
    """``ctx`` with this node's Slurm jobs where the per-job layout needs them for its
    instances; the slurm source reuses them."""
    if ctx.jobs is not None or ctx.config.mps.layout != "per-job":
        return ctx
    return ctx._replace(jobs=node_jobs(ctx))


def node_jobs(ctx: Context) -> JobList:
    """This node's Slurm jobs: one ``squeue``, bounded by ``slurm.timeout_s`` and the run's
    deadline; a failure as one line, never raised."""
    from mps_health.config.slurm import settings

    timeout_s = min(settings(ctx.config).timeout_s, ctx.remaining())
    done = run(squeue_argv(ctx.config, node_name(ctx.config, ctx.env)), timeout_s,
               env=child_env(ctx.env or {}))
    return _job_list(done, timeout_s)


def _job_list(done: Completed, timeout_s: float) -> JobList:
    """squeue's answer; the failure as one line, never raised."""
    try:
        return JobList(parsed(done, "squeue", timeout_s, parse_squeue))
    except SlurmError as e:
        return JobList(None, str(e))


def read_slurm(ctx: Context, want_jobs: bool) -> SlurmFacts:
    from mps_health.config.slurm import settings

    cfg = settings(ctx.config)
    node = node_name(ctx.config, ctx.env)
    env = child_env(ctx.env or {})
    argv = scontrol_argv(ctx.config, "-d", "show", "node", node, "-o")
    pending = [Pending(argv, env=env)]
    calls = [" ".join(argv)]
    squeue = squeue_argv(ctx.config, node)
    if want_jobs and ctx.jobs is None:  # else the run's instances already asked squeue
        pending.append(Pending(squeue, env=env))
    if want_jobs or ctx.jobs is not None:
        calls.append(" ".join(squeue))
    done = wait_all(pending, min(time.monotonic() + cfg.timeout_s, ctx.deadline))
    facts = SlurmFacts(node, calls=tuple(calls))
    jobs = _job_list(done[1], cfg.timeout_s) if len(done) > 1 else ctx.jobs
    if jobs is not None:
        facts = facts._replace(jobs=jobs.jobs, jobs_error=jobs.error or None)
    try:
        return facts._replace(node=parsed(done[0], "scontrol show node", cfg.timeout_s,
                                          parse_node_line))
    except SlurmError as e:
        return facts._replace(error_code=e.code, error=str(e))


class SharedRead:
    """The run's one node read, where the slurm source and the canary's idle gate both need
    the node (the ``-d`` answer serves the gate too): the first to ask reads,
    bounded as ``read_slurm`` is; the other waits for that answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: Optional[SlurmFacts] = None

    def get(self, ctx: Context, wait_s: float) -> Optional[SlurmFacts]:
        """The node's facts; None when another caller's read did not end within ``wait_s``."""
        if not self._lock.acquire(timeout=min(max(0.0, wait_s), threading.TIMEOUT_MAX)):
            return None
        try:
            if self._facts is None:
                self._facts = read_slurm(ctx, want_jobs=ctx.config.mps.layout == "per-job")
            return self._facts
        finally:
            self._lock.release()


def node_facts(ctx: Context) -> Optional[SlurmFacts]:
    """This run's Slurm facts: the shared read where the run made one, else a read of its
    own; None when the shared read did not end within the run's budget."""
    if ctx.slurm_node is None:
        return read_slurm(ctx, want_jobs=ctx.config.mps.layout == "per-job")
    return ctx.slurm_node.get(ctx, ctx.remaining())


def gather(ctx: Context, instances: object) -> SlurmFacts:
    facts = node_facts(ctx)
    if facts is None:
        raise SlurmError("timeout", "scontrol show node did not finish within the run's budget")
    return facts


VALUE_TYPE = SlurmFacts
