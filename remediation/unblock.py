"""unblock: free a control daemon that a local process holds, harming no one else.

What holds it is ``checks.blockers.find``'s rule: a stopped daemon or server of the
instance is continued (its jobs go on, where a reset would end them); an idle connection
or a stopped server the daemon never started is ended; a process of root's is only
named. Each PID is verified just before its signal (``processes.signal_verified``).
An unblock is no reset: it neither counts towards nor waits for the reset cooldown.
Used by ``remediate unblock``, by reset before it plans (a wedge an unblock cures needs
no restart) and by the health check (``healthcheck.unblock``).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from mps_health.checks import blockers
from mps_health.config.load import Config
from mps_health.engine import run as engine
from mps_health.hostio import unblocks
from mps_health.model.facts import ControlAnswer, DirFact, Facts, Instance, ProcessFact
from mps_health.probes import control as control_probe
from mps_health.probes.blockers import BlockerFacts
from mps_health.probes.context import Context
from mps_health.remediation import processes
from mps_health.remediation.audit import Audit

Say = Callable[[str], None]
NEEDS = ("processes", "dirs", "control", "blockers")
STEP = {"cont": "continue", "end": "end"}
WHAT = {"daemon": "the stopped control daemon", "server": "a stopped MPS server of this "
        "instance", "foreign-server": "a stopped MPS server binary the daemon did not start",
        "connection": "a connection to the control socket that sends no command"}


class Freed(NamedTuple):
    """What one unblock of an instance did."""

    inst: Instance
    acted: Tuple[Tuple[blockers.Blocker, processes.Ended], ...]
    left: Tuple[str, ...]  # blockers named but not acted on (root's), one line each
    answer: Optional[ControlAnswer]  # the daemon's answer afterwards (None: not asked)

    @property
    def answers(self) -> bool:
        return self.answer is not None and self.answer.status == "ok"


def plans(facts: Facts) -> Dict[str, Tuple[blockers.Blocker, ...]]:
    """Each instance's blockers by the check's rule (pure over one run's facts)."""
    found = facts.sources.get("blockers")
    procs: Tuple[ProcessFact, ...] = facts.sources.get("processes", ())  # type: ignore[assignment]
    dirs: Mapping[str, DirFact] = facts.sources.get("dirs", {})  # type: ignore[assignment]
    waiting = found.waiting if isinstance(found, BlockerFacts) else {}
    out = {}
    for inst in facts.instances:
        b = blockers.find(inst, procs, dirs.get(inst.pipe_dir), waiting.get(inst.name),
                          facts.root)
        if b:
            out[inst.name] = b
    return out


def step_text(b: blockers.Blocker) -> str:
    if not b.remedy:
        return (f"leave {blockers.who(b)}: {WHAT[b.kind]}, but a process of root's is never "
                f"ended by mps-health: see what it is ('ps -o pid,user,lstart,stat,args -p "
                f"{b.pid}') and end it by hand")
    how = "SIGCONT: its jobs go on" if b.remedy == "cont" else "SIGTERM, SIGKILL after 1s"
    return f"{STEP[b.remedy]} {blockers.who(b)}, {WHAT[b.kind]} ({how})"


def free(ctx: Context, inst: Instance, found: Sequence[blockers.Blocker], say: Say,
         audit: Optional[Audit], deadline: float) -> Freed:
    """Act on ``found`` (each PID verified first), then ask the daemon again."""
    acted: List[Tuple[blockers.Blocker, processes.Ended]] = []
    records: List[unblocks.Unblocked] = []
    left: List[str] = []
    for number, b in enumerate(found, 1):
        if not b.remedy:
            left.append(step_text(b))
            say(f"  {number}. left: {step_text(b)}")
            continue
        done = processes.signal_verified(ctx.proc, b.pid, b.uid, b.start_ticks,
                                         end=b.remedy == "end")
        acted.append((b, done))
        ok = done.outcome in ("continued", "terminated", "killed", "gone")
        say(f"  {number}. {'ok' if ok else 'FAILED'}: {STEP[b.remedy]} pid {b.pid}: "
            f"{done.detail}")
        if audit is not None:
            audit.record(f"unblock-{b.remedy}", "ok" if ok else "failed", instance=inst.name,
                         pid=str(b.pid), uid=str(b.uid), kind=b.kind, detail=done.detail)
        if done.outcome in ("continued", "terminated", "killed"):
            records.append(unblocks.Unblocked(time.time(), b.uid,
                                              b.holder.user if b.holder else None,
                                              inst.name, b.kind))
    problem = unblocks.record(ctx.path(ctx.config.state_dir), records, time.time()) \
        if records and audit is not None else ""
    if problem:
        say(f"  note: {problem}")
    answer = None
    if acted:
        answer = control_probe.ask(ctx._replace(queries=None), inst, control_probe.QUERY,
                                   max(deadline, time.monotonic() + 0.5))
        say(f"  result: the daemon answers again ({answer.latency_s * 1000:.0f} ms)"
            if answer.status == "ok" else
            f"  result: the daemon still does not answer ({answer.detail or answer.status}): "
            "see 'mps-health check -v'")
    return Freed(inst, tuple(acted), tuple(left), answer)


def summary(freed: Freed) -> str:
    """One line of what an unblock did: 'ended pid 812 (...), a connection ...; the
    daemon answers again (12 ms)'."""
    done = [f"{'continued' if b.remedy == 'cont' else 'ended'} {blockers.who(b)}, "
            f"{WHAT[b.kind]}" if s.outcome in ("continued", "terminated", "killed") else
            f"pid {b.pid}: {s.detail}" for b, s in freed.acted]
    done += list(freed.left)
    answer = freed.answer
    after = "" if answer is None else (
        f"the daemon answers again ({answer.latency_s * 1000:.0f} ms)" if freed.answers
        else f"the daemon still does not answer ({answer.detail or answer.status})")
    return "; ".join(filter(None, (*done, after)))


def look(config: Config, root: str, insts: Tuple[Instance, ...], budget_s: float) -> Facts:
    """The facts an unblock plans on (processes, dirs, one control query, the blockers),
    of ``insts`` only."""
    facts = engine.facts_within(engine.fit_control(config, budget_s), root, NEEDS, budget_s)
    names = {i.name for i in insts}
    return facts._replace(instances=tuple(i for i in facts.instances if i.name in names))


def unanswered(facts: Facts, name: str) -> str:
    found = facts.sources.get("blockers")
    waiting = found.waiting.get(name) if isinstance(found, BlockerFacts) else None
    return waiting.unanswered if waiting is not None else ""
