"""servers: no MPS server in FAULT, none stuck INITIALIZING, no restart or churn lately.

A daemon that answers does not prove MPS serves work: a server in FAULT refuses new
clients until its clients exit; one stuck INITIALIZING holds its clients forever. Daemon
restarts and servers gone under live clients (``probes.servertrack``) stay reported for
``servers.event_window_s``.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

from mps_health.checks.common import group, present, reset_action, user_of
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import VERBOSE, quoted
from mps_health.model.facts import Facts, Instance
from mps_health.model.facts_deep import (
    InstanceServers,
    ServerEvent,
    ServerFact,
    ServerMemory,
    ServersFacts,
)
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, Result, ok
from mps_health.probes.servers import settings
from mps_health.probes.servertrack import advance, status_since

NAME = "servers"
CODES = ("server-fault", "server-stuck-initializing", "server-unreadable", "servers-not-asked",
         "daemon-restarted", "server-churn",  # these two: events of probes/servertrack.py
         "history-not-saved")  # a note (OK), no check passed: not in "N checks passed"

registry.check(NAME, f"{__name__}:check", ("servers",), order=60,
               summary="no MPS server in FAULT or stuck INITIALIZING; no restart or churn lately")


def describe(server: ServerFact) -> str:
    who = user_of(server.user, server.uid, "user unknown")
    if not server.clients:
        return f"server {server.pid} ({who}) with no client"
    shown = ", ".join(f"{c.pid}" + (f" ({c.user or c.uid})" if c.uid is not None else "")
                      for c in server.clients[:8])
    more = f", +{len(server.clients) - 8} more" if len(server.clients) > 8 else ""
    return f"server {server.pid} ({who}) with clients {shown}{more}"


def _repeated(group: List[ServerEvent], now: float) -> str:
    """One line for one or many events of a code: the latest, how many, first and last."""
    last = group[-1]
    if len(group) == 1:
        return f"{last.message} ({(now - last.at) / 60:.0f} min ago)"
    return (f"{len(group)} times, first {(now - group[0].at) / 60:.0f} min ago, last "
            f"{(now - last.at) / 60:.0f} min ago; the last: {last.message}")


def judge(inst: Instance, cur: InstanceServers, memory: ServerMemory, now: float,
          config: Config) -> Iterator[Result]:
    cfg = settings(config)
    live = [s for s in cur.servers if s.status != "gone"]
    values = present(("servers", len(live)), ("clients", sum(len(s.clients) for s in live)),
                     ("servers_fault", sum(s.status == "FAULT" for s in live)),
                     ("servers_initializing", sum(s.status == "INITIALIZING" for s in live)))
    found = False
    reset = reset_action(inst.name)
    for server in cur.servers:
        if server.status == "FAULT":
            found = True
            yield Result(NAME, CRITICAL, "server-fault", inst.name,
                         f"{describe(server)} is in FAULT: new clients get "
                         "CUDA_ERROR_MPS_SERVER_NOT_READY until its clients exit",
                         reset.text + "; it ends the faulted clients' MPS session", values,
                         commands=reset.commands)
        elif server.status == "INITIALIZING":
            since: Optional[float] = status_since(memory, server)
            waited = now - since if since is not None else 0.0
            if waited >= cfg.init_stuck_s:
                found = True
                yield Result(NAME, CRITICAL, "server-stuck-initializing", inst.name,
                             f"{describe(server)} has been INITIALIZING for {waited:.0f}s "
                             f"(limit {cfg.init_stuck_s:g}s): its clients wait forever",
                             reset.text, (*values, ("initializing_s", waited)),
                             commands=reset.commands)
        elif server.status == "error":
            found = True
            yield Result(NAME, UNKNOWN, "server-unreadable", inst.name,
                         f"server {server.pid}: {server.detail}",
                         f"see the control check; run {quoted(VERBOSE)} as root", values,
                         commands=(VERBOSE,))
    # One finding per code, its events oldest first.
    for code, events in group(sorted(memory.events, key=lambda e: e.at), lambda e: e.code).items():
        found = True
        ack = ("mps-health", "ack", code, inst.name)
        yield Result(NAME, WARNING, code, inst.name, _repeated(events, now),
                     "read the instance's control.log around that time (see the logs "
                     f"check); once explained, run {quoted(ack)}",
                     (*values, ("events", float(len(events)))), commands=(ack,))
    if not found:
        text = "; ".join(f"{describe(s)}: {s.status}" for s in live) or "no server running"
        yield Result(NAME, 0, "ok", inst.name, text, "", values)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    sf: ServersFacts = facts.sources["servers"]  # type: ignore[assignment]
    if sf.state_error:
        yield Result(NAME, 0, "history-not-saved", "", f"server history: {sf.state_error}")
    for inst in facts.instances:
        cur = sf.instances.get(inst.name)
        if cur is None:
            yield Result(NAME, UNKNOWN, "servers-not-asked", inst.name,
                         "no server query was made for this instance", "")
            continue
        memory = advance(sf.previous.get(inst.name), cur, sf.alive, sf.taken_at,
                         settings(config).event_window_s, sf.planned, inst.pipe_dir,
                         acks=sf.acks, instance=inst.name)
        if cur.query not in ("ok", "idle"):
            yield Result(NAME, UNKNOWN, "servers-not-asked", inst.name,
                         f"cannot list the servers ({cur.query}: {cur.detail})",
                         "see the daemon and control checks")
            yield from (r for r in judge(inst, cur._replace(servers=()), memory, sf.taken_at,
                                         config) if r.state)
            continue
        yield from judge(inst, cur, memory, sf.taken_at, config)
    if not facts.instances:
        yield ok(NAME, "", "no MPS instance on this node")
