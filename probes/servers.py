"""Every MPS server of every instance: status, user and clients, through the real client.

Cheap when idle: a server is a child of its daemon, so when the daemon the pid file
names has no child, nothing is asked (two small /proc reads). The previous run's memory
(state_dir/servers.json) is read into the facts and the next one written after gathering
(replay never writes). It tells strays a real daemon's server from anyone's run of the
binary: only a child of the pid file's daemon running as ``mps.daemon_user`` is marked.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from mps_health.config.deep_checks import SERVERS, ServersConfig
from mps_health.config.load import Config
from mps_health.hostio.pidfile import read_pid
from mps_health.hostio.safefiles import read_small
from mps_health.model.facts import Instance
from mps_health.model.facts_deep import InstanceServers, ServerMemory, ServersFacts
from mps_health.probes import proc
from mps_health.probes.context import Context, joined
from mps_health.probes.process_identity import is_daemon


def settings(config: Config) -> ServersConfig:
    return config.get(SERVERS)


def parse_children(text: str) -> Tuple[int, ...]:
    """``/proc/PID/task/TID/children``: PIDs separated by spaces."""
    return tuple(int(w) for w in text.split() if w.isdigit())


def read_daemon(ctx: Context, inst: Instance) -> Tuple[Optional[int], Optional[int], bool]:
    """(daemon pid, start ticks, has children) from the pid file and /proc; has children
    is True whenever it cannot be shown false, so the daemon is asked."""
    pid = read_pid(ctx.path(inst.pipe_dir))
    if pid is None:
        return None, None, True
    fact = proc.read_process(ctx.proc, pid, proc.binaries_here(ctx))
    if fact is None or not is_daemon(fact) or not _expected_user(ctx, inst, fact.uid):
        # Not the instance's daemon (anyone may write a pid in a 0777 pipe dir): no
        # daemon is named, so nothing listed is remembered as its server.
        return None, None, True
    try:
        for tid in os.listdir(f"{ctx.proc}/{pid}/task"):
            children = read_small(f"{ctx.proc}/{pid}/task/{tid}/children", 65536)
            if children is None or parse_children(children.decode("ascii", "replace")):
                return pid, fact.start_ticks, True
    except OSError:  # a thread or the daemon gone meanwhile: ask rather than assume idle
        return pid, fact.start_ticks, True
    return pid, fact.start_ticks, False


def _expected_user(ctx: Context, inst: Instance, uid: int) -> bool:
    """Does ``uid`` run the instance's daemon as ``mps.daemon_user`` says? ("job": the
    pipe dir's owner, by lstat.)"""
    from mps_health.probes.instances import daemon_uid

    if ctx.config.mps.daemon_user == "job":
        try:
            st = os.lstat(ctx.path(inst.pipe_dir))
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == uid
    want = daemon_uid(ctx.config.mps.daemon_user, None)
    return want is None or want == uid


def daemon_children(ctx: Context, found: InstanceServers) -> Tuple[Tuple[int, int], ...]:
    """The listed servers that /proc shows as children of the instance's daemon."""
    if found.daemon_pid is None:
        return ()
    return tuple((s.pid, s.start_ticks) for s in found.servers if s.start_ticks is not None
                 and proc.identity(ctx.proc, s.pid, uid=False)
                 == (found.daemon_pid, s.start_ticks))


def still_live(ctx: Context, procs: Iterable[Tuple[int, int]]) -> Tuple[Tuple[int, int], ...]:
    """Which of ``procs`` (pid, start ticks) still live: the same pid, started then."""
    return tuple(sorted({(pid, start) for pid, start in procs
                         if (ident := proc.identity(ctx.proc, pid)) and ident[1] == start}))


def _untimed(m: Mapping[str, ServerMemory]) -> Dict[str, ServerMemory]:
    """The memory less its time: only a change beside it is worth a write."""
    return {k: v._replace(taken_at=0.0) for k, v in m.items()}


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> ServersFacts:
    return start(ctx, instances)()


def start(ctx: Context, instances: Tuple[Instance, ...]) -> Callable[[], ServersFacts]:
    """The cheap tier now, and a thread each for the instances whose daemon has servers;
    returns the function that collects them and keeps the run's memory. An idle node
    starts no thread: one reading two /proc files would only trade the GIL with the run."""
    now = time.time()
    results: Dict[str, InstanceServers] = {}

    def one(inst: Instance, daemon: Tuple[Optional[int], Optional[int]]) -> None:
        results[inst.name] = read_instance(ctx, inst, daemon)

    threads = []
    for inst in instances:
        t0 = time.monotonic()
        daemon_pid, daemon_start, busy = read_daemon(ctx, inst)
        if busy:
            # Imported here, only where a server runs, and before the thread starts: two
            # threads importing at once only hand the GIL back and forth.
            from mps_health.probes.server_queries import read_instance

            t = threading.Thread(target=one, args=(inst, (daemon_pid, daemon_start)),
                                 name=f"servers of {inst.name}", daemon=True)
            t.start()
            threads.append(t)
        else:
            results[inst.name] = InstanceServers(
                "idle", "the control daemon has no server process", daemon_pid,
                daemon_start, (), time.monotonic() - t0)
    return lambda: _collect(ctx, instances, now, results, threads)


def _collect(ctx: Context, instances: Tuple[Instance, ...], now: float,
             results: Dict[str, InstanceServers], threads: List[threading.Thread]) -> ServersFacts:
    from mps_health.hostio.planned import load as load_planned
    from mps_health.hostio.planned import load_acks
    from mps_health.hostio.state import StateFile
    from mps_health.probes import servertrack

    cfg = settings(ctx.config)
    state = StateFile(ctx.path(ctx.config.state_dir), "servers")
    locked = not ctx.read_only and state.lock(min(time.monotonic() + 1.0, ctx.deadline))
    previous, error = state.load(Dict[str, ServerMemory], {}) \
        if not ctx.read_only else ({}, "")
    old_servers = [s for memory in previous.values() for s in memory.servers]
    alive = still_live(ctx, (c for s in old_servers for c in s.clients))
    servers_alive = still_live(ctx, ((s.pid, s.start_ticks) for s in old_servers))
    for t in threads:
        joined(t, ctx.remaining())
    for inst in instances:
        results.setdefault(inst.name, InstanceServers(
            "timeout", "no answer within the run's budget", None, None, (), 0.0))
    planned, planned_error = load_planned(ctx.path(ctx.config.state_dir))
    acks, acks_error = load_acks(ctx.path(ctx.config.state_dir))
    facts = ServersFacts(now, dict(results), previous, alive,
                         error or state.error or planned_error or acks_error, planned, acks)
    if locked:
        memory = {inst.name: servertrack.advance(previous.get(inst.name), results[inst.name],
                                                 alive, now, cfg.event_window_s, planned,
                                                 inst.pipe_dir, servers_alive,
                                                 daemon_children(ctx, results[inst.name]),
                                                 acks, inst.name)
                  for inst in instances}
        # Keep the memory of instances not seen this run (a per-job dir between jobs) for
        # the window, their events still matter; and past it while one of its servers
        # still lives, so that strays knows it for a real daemon's server.
        living = set(servers_alive)
        for name, old in previous.items():
            kept = tuple(s for s in old.servers if (s.pid, s.start_ticks) in living)
            if name not in memory and now - old.taken_at <= cfg.event_window_s:
                memory[name] = old
            elif name not in memory and kept:
                memory[name] = old._replace(servers=kept, events=())
        saved = state.save(memory) if _untimed(previous) != _untimed(memory) else ""
        state.unlock()
        if saved:
            facts = facts._replace(state_error=saved)
    return facts


VALUE_TYPE = ServersFacts
