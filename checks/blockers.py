"""blockers: name the local process that holds a control daemon, and how to free it.

MPS's control daemon reads one connection at a time, so any local user can hold it: a
connection to the 0666 ``control`` socket that sends nothing (``blocked-connection``),
the instance's own server stopped by its user (``blocked-server``: it runs as its
clients' uid), or the world-executable server binary run on the pipe dir and stopped
(``blocked-foreign-server``). Every query and every new client of every user then
waits. Nothing is broken: ending the blocker (or continuing the stopped server) cures
it at once, and a reset would only end other users' work. So each is named (pid, user,
job, since when) with the step that frees it, ``mps-health remediate unblock``; the
health check takes that step itself and never drains for it. A stopped daemon is the
daemon check's ``daemon-stopped``; a uid that blocks MPS again and again is
``blocker-repeated``.

``find`` is the one rule of what blocks an instance; ``remediate unblock`` acts on it.
"""

from __future__ import annotations

import time
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

from mps_health.checks.common import group, live_daemons
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import Advice, advice
from mps_health.hostio.unblocks import Unblocked
from mps_health.model.facts import DirFact, Facts, Instance, ProcessFact
from mps_health.model.printable import escape
from mps_health.model.results import CRITICAL, OK, WARNING, Result
from mps_health.probes.blockers import BlockerFacts, Holder, Waiting
from mps_health.probes.instances import pipe_paths
from mps_health.probes.process_identity import STOPPED_STATES, is_server

NAME = "blockers"
CODES = ("blocked-connection", "blocked-server", "blocked-foreign-server", "blocker-repeated")

registry.check(NAME, f"{__name__}:check", ("processes", "dirs", "control", "blockers"),
               order=32, summary="no local process holds a control daemon")

# Unblocks of one uid within hostio.unblocks.KEEP_S that make it a repeated blocker.
REPEATED = 3


class Blocker(NamedTuple):
    """A process that holds an instance's daemon, and the step that frees it."""

    kind: str  # "connection" | "server" | "foreign-server" | "daemon"
    pid: int
    uid: int
    start_ticks: int
    state: str
    remedy: str  # "cont" (stopped, ours: its jobs go on) | "end" | "" (root's: by hand)
    holder: Optional[Holder] = None  # who, in which job, since when, where known


def _named(p: ProcessFact, known: Mapping[int, Holder]) -> Optional[Holder]:
    h = known.get(p.pid)
    return h if h is not None and h.start_ticks == p.start_ticks else None


def find(inst: Instance, procs: Tuple[ProcessFact, ...], pipe: Optional[DirFact],
         waiting: Optional[Waiting], root: str = "/") -> Tuple[Blocker, ...]:
    """What holds ``inst``'s daemon (pure). A stopped daemon or own server holds it
    whenever it is stopped; a stopped foreign server and a connection count once the
    daemon gave no answer (``waiting``): by their effect, not their look."""
    daemons = live_daemons(inst, procs, pipe, root)
    pids = {d.pid for d in daemons}
    known = {h.pid: h for h in waiting.processes} if waiting is not None else {}
    found: List[Blocker] = [Blocker("daemon", d.pid, d.uid, d.start_ticks, d.state, "cont",
                                    _named(d, known))
                            for d in daemons if d.state in STOPPED_STATES]
    paths = set(pipe_paths(inst, root))
    for p in procs:
        if not is_server(p) or p.genuine is not True:
            continue
        if p.ppid in pids and p.state in STOPPED_STATES:
            found.append(Blocker("server", p.pid, p.uid, p.start_ticks, p.state, "cont",
                                 _named(p, known)))
        elif waiting is not None and p.ppid not in pids and p.pipe_dir in paths \
                and (p.state in STOPPED_STATES or p.traced):
            found.append(Blocker("foreign-server", p.pid, p.uid, p.start_ticks, p.state,
                                 "end", _named(p, known)))
    children = {p.pid for p in procs if p.ppid in pids}
    named = {b.pid for b in found}
    for conn in waiting.connections if waiting is not None else ():
        for h in conn.holders:
            if h.pid in pids or h.pid in children or h.pid in named:
                continue  # the daemon's own, its server's, or already named above
            found.append(Blocker("connection", h.pid, h.uid, h.start_ticks, h.state,
                                 "end" if h.uid != 0 else "", h))
    return tuple(found)


def who(b: Blocker) -> str:
    """'pid 812 (python3, user alice, uid 1001, job 77, running since 03:40:12)'."""
    h = b.holder
    if h is None:
        return f"pid {b.pid} (uid {b.uid})"
    parts = [escape(h.comm)] if b.kind == "connection" else []
    parts += [f"user {escape(h.user)}" if h.user else "", f"uid {h.uid}",
              f"job {escape(h.job_id)}" if h.job_id else ""]
    if h.started_at is not None:
        parts.append("running since " + time.strftime("%Y-%m-%d %H:%M:%S",
                                                       time.localtime(h.started_at)))
    return f"pid {b.pid} ({', '.join(p for p in parts if p)})"


UNBLOCK = ("mps-health", "remediate", "unblock")


def unblock_action(inst: str) -> Advice:
    return advice("run ", (*UNBLOCK, inst), " (dry run first: --dry-run); never a reset for "
                  "this: it would end other users' work")


def judge(inst: Instance, blockers: Tuple[Blocker, ...], waiting: Optional[Waiting]
          ) -> Iterator[Result]:
    daemon = f"control daemon {waiting.daemons[0]}" if waiting and waiting.daemons \
        else "the control daemon"
    held = [b for b in blockers if b.kind != "daemon"]
    # One series per instance (mps_health_blockers): the count, never a pid or uid label.
    values = (("blockers", float(len(held))),)
    unblock = unblock_action(inst.name)
    for b in held:
        if b.kind == "server":
            go_on = advice(f"run 'kill -CONT {b.pid}' (its job goes on), or ",
                           (*UNBLOCK, inst.name), "; never a reset for this")
            yield Result(NAME, CRITICAL, "blocked-server", inst.name,
                         f"MPS server {who(b)} of this instance is stopped (state {b.state}): "
                         "the control daemon and every new client of every user wait for it",
                         go_on.text, values, commands=go_on.commands)
        elif b.kind == "foreign-server":
            yield Result(NAME, CRITICAL, "blocked-foreign-server", inst.name,
                         f"nvidia-cuda-mps-server {who(b)}, which the control daemon did not "
                         f"start, is stopped (state {b.state}) on {inst.pipe_dir}: the daemon "
                         "and every new client of every user wait for it",
                         unblock.text, values, commands=unblock.commands)
        else:
            action = unblock if b.remedy else Advice(
                f"pid {b.pid} runs as root, so mps-health does not end it: see what it is "
                f"('ps -o pid,user,lstart,stat,args -p {b.pid}') and end it by hand")
            yield Result(NAME, CRITICAL, "blocked-connection", inst.name,
                         f"{daemon} waits on a connection to its control socket held by "
                         f"{who(b)} that sends no command: every query and every new client "
                         "of every user waits", action.text, values,
                         commands=action.commands)
    if held:
        return
    if waiting is None:
        yield Result(NAME, OK, "ok", inst.name, "nothing holds the control daemon", "",
                     (("blockers", 0.0),))
    elif waiting.why:
        yield Result(NAME, OK, "ok", inst.name, f"the daemon gave no answer and no blocker "
                     f"was found, but one cannot be ruled out: {escape(waiting.why)}", "",
                     (("blockers", 0.0),))
    else:
        yield Result(NAME, OK, "ok", inst.name, "the daemon gave no answer and nothing on "
                     "the node holds it (no connection, no stopped server): see the control "
                     "check", "", (("blockers", 0.0),))


def repeated(recent: Tuple[Unblocked, ...], now: float) -> Iterator[Result]:
    """One WARNING per uid that blocked MPS ``REPEATED`` times or more in the records."""
    for uid, mine in sorted(group(recent, lambda r: r.uid).items()):
        if len(mine) < REPEATED:
            continue
        last = mine[-1]
        user = f"user {escape(last.user)}, " if last.user else ""
        yield Result(NAME, WARNING, "blocker-repeated", "",
                     f"{user}uid {uid} blocked MPS on this node {len(mine)} times in the last "
                     f"day (the last on {escape(last.instance)}, "
                     f"{last.kind}, {(now - last.at) / 60:.0f} min ago); mps-health freed it "
                     "each time", "ask the user what their jobs do to MPS (a connection to the "
                     "control socket that sends nothing, a stopped MPS server); it is no node "
                     "fault")


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    dirs: Mapping[str, DirFact] = facts.get("dirs")
    found: BlockerFacts = facts.get("blockers")
    waiting: Dict[str, Waiting] = found.waiting
    for inst in facts.instances:
        w = waiting.get(inst.name)
        yield from judge(inst, find(inst, procs, dirs.get(inst.pipe_dir), w, facts.root), w)
    yield from repeated(found.recent, facts.taken_at)
