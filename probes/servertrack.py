"""Identity of control daemons and MPS servers across runs: pure, shared by probe and check.

A process is named by (pid, start ticks), so a reused PID is a new process. Events between
two runs: ``daemon-restarted`` (the instance's control daemon changed: its clients lost
MPS) and ``server-churn`` (a server went away while clients it served last run still live:
one ending with its job leaves none behind, so it died under running work).

Neither is an event when mps-health did it itself (``hostio/planned.py``: a recorded
restart, servers lost while it ended their daemon). A reset drops the events before it,
as an operator's ``mps-health ack`` does for its code's. The probe calls :func:`advance`
to save the next memory, the check on the same facts to know the events: both agree.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from mps_health.model.facts_deep import (
    Ack,
    InstanceServers,
    PlannedRestart,
    RememberedServer,
    ServerEvent,
    ServerFact,
    ServerMemory,
)

# Events kept per instance (the newest): the finding counts them, the file stays small.
MAX_EVENTS = 100
# The codes of events: what ``mps-health ack`` acknowledges (hostio/planned.py).
EVENT_CODES = ("daemon-restarted", "server-churn")


def advance(previous: Optional[ServerMemory], current: InstanceServers,
            alive: Iterable[Tuple[int, int]], now: float, window_s: float,
            planned: Sequence[PlannedRestart] = (), pipe_dir: str = "",
            servers_alive: Iterable[Tuple[int, int]] = (),
            children: Iterable[Tuple[int, int]] = (), acks: Sequence[Ack] = (),
            instance: str = "") -> ServerMemory:
    """The memory after this run: statuses with the time first seen, events in window.
    Our own daemon changes for ``pipe_dir`` (``planned``) make no event; a reset, or an
    operator's ack for ``instance``, drops the events before it. A remembered server no
    longer listed but alive (``servers_alive``) is kept, still known as a real daemon's
    server; listed servers /proc shows as the daemon's ``children`` are marked so."""
    from mps_health.hostio.planned import acked_until, excused, repaired_at, servers_ended

    repaired = repaired_at(planned, pipe_dir, now)
    until = {code: max(repaired, acked_until(acks, instance, code)) for code in EVENT_CODES}
    events: List[ServerEvent] = [e for e in (previous.events if previous else ())
                                 if now - e.at <= window_s
                                 and e.at > until.get(e.code, repaired)]
    if current.query not in ("ok", "idle"):
        # Nothing reliable seen this run: keep what we knew, do not invent events.
        if previous is None:
            return ServerMemory(now, current.daemon_pid, current.daemon_start, (), tuple(events))
        return previous._replace(events=tuple(events))
    daemon = (current.daemon_pid, current.daemon_start)
    if previous is not None and None not in (previous.daemon_pid, current.daemon_pid) \
            and (previous.daemon_pid, previous.daemon_start) != daemon \
            and not excused(planned, pipe_dir, previous.taken_at, now, *daemon):
        events.append(ServerEvent(now, "daemon-restarted",
                                  f"the control daemon changed since the last run "
                                  f"(was {previous.daemon_pid}, now {current.daemon_pid}): "
                                  "its clients lost MPS"))
    seen: Dict[Tuple[int, int], ServerFact] = {
        (s.pid, s.start_ticks): s for s in current.servers
        if s.start_ticks is not None and s.status != "gone"}
    still: Set[Tuple[int, int]] = set(alive)
    # Our own action ended the daemon (and its servers) in between: no churn.
    ours = previous is not None and servers_ended(planned, pipe_dir, previous.taken_at, now)
    living = set(servers_alive)
    kept: List[RememberedServer] = []
    for old in (previous.servers if previous else ()):
        if (old.pid, old.start_ticks) in seen:
            continue
        if (old.pid, old.start_ticks) in living:
            kept.append(old)  # not gone: no churn; strays judges it
            continue
        orphans = [pid for pid, start in old.clients if (pid, start) in still]
        if orphans and not ours:
            who = f"server {old.pid}" + (f" ({old.user})" if old.user else "")
            shown = ", ".join(str(p) for p in orphans[:8])
            events.append(ServerEvent(now, "server-churn", f"{who} went away while its clients "
                                      f"{shown} still run (no job ended)"))
    before = {(s.pid, s.start_ticks): s for s in (previous.servers if previous else ())}
    child = set(children)
    for key, server in seen.items():
        was = before.get(key)
        since = was.status_since if was is not None and was.status == server.status else now
        clients = tuple((c.pid, c.start_ticks) for c in server.clients
                        if c.start_ticks is not None)
        kept.append(RememberedServer(server.pid, key[1], server.status, since,
                                     server.user or "", clients,
                                     key in child or (was is not None and was.daemon_child)))
    return ServerMemory(now, current.daemon_pid, current.daemon_start, tuple(kept),
                        tuple(events[-MAX_EVENTS:]))


def status_since(memory: ServerMemory, server: ServerFact) -> Optional[float]:
    """When ``server``'s current status was first seen (from the advanced memory)."""
    return next((s.status_since for s in memory.servers
                 if (s.pid, s.start_ticks) == (server.pid, server.start_ticks)), None)


def remembered(previous: Mapping[str, ServerMemory]) -> Set[Tuple[int, int]]:
    """(pid, start ticks) of every server an earlier run saw as the child of its
    instance's control daemon: MPS's own servers, whatever became of their daemon. The
    listing alone proves nothing (whatever answers on the socket, a user's in a 0777 pipe
    dir, may name any pid), nor does a memory that named no daemon."""
    return {(s.pid, s.start_ticks) for m in previous.values() if m.daemon_pid is not None
            for s in m.servers if s.daemon_child}
