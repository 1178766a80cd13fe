"""Every MPS server of every instance: status, user and clients, through the real client.

Per instance: ``get_server_list``, then ``get_server_status PID`` and ``get_client_list
PID`` for each server; while a server runs, also its limits and devices
(``get_active_thread_percentage``, ``device_query``, ``get_device_pinned_mem_limit``,
``get_device_client_list``, ``ps``) and who each client is
(mps_health.core.probes.clientinfo): one client run each (the client's exit status says
nothing, so each answer is parsed), all while holding the pipe dir's lock that the control probe
takes, so our queries to one daemon never overlap. Users come from /proc.

Cheap when idle: a server is a child of its control daemon, so when the daemon the pid
file names has no child process at all, no server runs and nothing is asked (the fast
tier pays two small /proc reads, not a client run). The previous run's memory
(state_dir/servers.json) is read into the facts and the next one written here, after
gathering: replay never writes.
"""

from __future__ import annotations

import os
import time

from ..background import Background
from ..config import Config
from ..context import Context
from ..facts import Instance
from ..facts_deep import (
    ClientFact,
    DeviceFact,
    InstanceServers,
    ServerFact,
    ServerMemory,
    ServersFacts,
)
from ..pidfile import read_pid
from ..process_identity import is_daemon
from ..safefiles import read_small
from ..users import name_of
from . import control, proc
from .sections import SERVERS, ServersConfig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

    from . import clientinfo

    T = TypeVar("T")

STATUSES = ("ACTIVE", "INITIALIZING", "FAULT")


class ParseError(ValueError):
    pass


def settings(config: Config) -> ServersConfig:
    return config.get(SERVERS)


# --- parse (pure) ---------------------------------------------------------------------

def parse_pid_list(text: str) -> Tuple[int, ...]:
    """``get_server_list`` / ``get_client_list``: one PID a line; empty means none."""
    pids = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.isdigit():
            raise ParseError(f"expected one PID a line, got {line[:60]!r}")
        pids.append(int(line))
    return tuple(pids)


def parse_server_status(text: str) -> str:
    """``get_server_status PID``: ACTIVE, INITIALIZING, FAULT; "gone" for not found."""
    first = (text.strip().splitlines() or [""])[0].strip()
    if first in STATUSES:
        return first
    if first.startswith("Server ") and first.endswith(" not found"):
        return "gone"
    raise ParseError(f"unexpected status {first[:60]!r}")


def parse_children(text: str) -> Tuple[int, ...]:
    """``/proc/PID/task/TID/children``: PIDs separated by spaces."""
    return tuple(int(w) for w in text.split() if w.isdigit())


# --- read (I/O) -----------------------------------------------------------------------

def _read_small(path: str) -> Optional[str]:
    try:
        data = read_small(path, 65536)
    except OSError:
        return None
    return None if data is None else data.decode("ascii", "replace")


def read_daemon(ctx: Context, inst: Instance) -> Tuple[Optional[int], Optional[int], bool]:
    """(daemon pid, start ticks, has children) from the pid file and /proc.

    ``has children`` is True whenever it cannot be shown false, so the daemon is asked.
    """
    pid = read_pid(ctx.path(inst.pipe_dir))
    if pid is None:
        return None, None, True
    fact = proc.read_process(ctx.proc, pid, proc.binaries_here(ctx))
    if fact is None or not is_daemon(fact):
        return None, None, True
    try:
        tids = os.listdir(f"{ctx.proc}/{pid}/task")
    except OSError:
        return pid, fact.start_ticks, True
    for tid in tids:
        children = _read_small(f"{ctx.proc}/{pid}/task/{tid}/children")
        if children is None or parse_children(children):
            return pid, fact.start_ticks, True
    return pid, fact.start_ticks, False


def read_clients(ctx: Context, pids: Tuple[int, ...]) -> Tuple[ClientFact, ...]:
    out: List[ClientFact] = []
    for pid in pids:
        ident = proc.identity(ctx.proc, pid)
        uid, start = ident if ident else (None, None)
        fact = ClientFact(pid, uid, name_of(uid), start)
        if ident is not None:
            from . import clientinfo  # only where a server runs: not on an idle node's path

            info = clientinfo.read_client(ctx.proc, pid, start)
            fact = fact._replace(**info._asdict())
        out.append(fact)
    return tuple(out)


def _answer(ctx: Context, inst: Instance, command: str, deadline: float,
            errors: List[str]) -> Optional[str]:
    """stdout of one detail query, or None with a note in ``errors``."""
    answer = control.ask(ctx, inst, command, deadline)
    if answer.status != "ok":
        errors.append(f"{command}: {answer.detail or answer.status}")
        return None
    return answer.stdout


def _parsed(ctx: Context, inst: Instance, command: str, deadline: float, errors: List[str],
            parse: Callable[[str], T], empty: T, label: str = "") -> T:
    """One detail query's answer through ``parse``; ``empty`` with a note in ``errors``
    when the query failed or its answer did not parse (``label: why``, or just why)."""
    from . import clientinfo

    text = _answer(ctx, inst, command, deadline, errors)
    if text is None:
        return empty
    try:
        return parse(text)
    except clientinfo.ParseError as e:
        errors.append(f"{label}: {e}" if label else str(e))
        return empty


def read_details(ctx: Context, inst: Instance, server: ServerFact,
                 devices: Tuple[clientinfo.DeviceRow, ...], deadline: float) -> ServerFact:
    """The limits and devices of a running server: thread percentage, pinned memory
    limit and client contexts per device. A failed query leaves its field empty."""
    from . import clientinfo

    errors: List[str] = []
    pct: Optional[float] = _parsed(
        ctx, inst, f"get_active_thread_percentage {server.pid}", deadline, errors,
        clientinfo.parse_percentage, None, "get_active_thread_percentage")
    contexts: Dict[int, int] = _parsed(
        ctx, inst, f"get_device_client_list {server.pid}", deadline, errors,
        clientinfo.parse_device_clients, {})
    facts = []
    no_limit: Tuple[str, Optional[int]] = ("", None)
    for row in devices:
        limit, limit_bytes = _parsed(
            ctx, inst, f"get_device_pinned_mem_limit {server.pid} {row.ordinal}", deadline,
            errors, clientinfo.parse_mem_limit, no_limit, "get_device_pinned_mem_limit")
        facts.append(DeviceFact(row.ordinal, row.uuid, row.name, row.pci, limit, limit_bytes,
                                contexts.get(row.ordinal)))
    return server._replace(thread_percentage=pct, devices=tuple(facts),
                           detail_errors=tuple(errors))


def read_instance_details(ctx: Context, inst: Instance, servers: List[ServerFact]
                          ) -> Tuple[List[ServerFact], Tuple[Tuple[int, str], ...]]:
    """Per-server details, each client's GPUs from ``ps``, the default memory limits."""
    from . import clientinfo

    errors: List[str] = []
    deadline = ctx.deadline
    table: Dict[str, Tuple[clientinfo.DeviceRow, ...]] = _parsed(
        ctx, inst, "device_query", deadline, errors, clientinfo.parse_device_query, {})
    rows: Tuple[clientinfo.PsRow, ...] = _parsed(
        ctx, inst, "ps", deadline, errors, clientinfo.parse_ps, ())
    out = []
    for server in servers:
        if server.status in ("gone", "error"):
            out.append(server)
            continue
        server = read_details(ctx, inst, server, table.get(str(server.pid), ()), deadline)
        clients = []
        for c in server.clients:
            mine = [r for r in rows if r.pid == c.pid and r.server == server.pid]
            clients.append(c._replace(gpus=tuple(dict.fromkeys(r.device for r in mine)),
                                      namespace=mine[0].namespace if mine else ""))
        out.append(server._replace(clients=tuple(clients),
                                   detail_errors=server.detail_errors + tuple(errors)))
    defaults = []
    for row in table.get("default", ()):
        # A default limit that cannot be read or parsed is left out, without a note: the
        # servers' notes are taken above.
        limit = _parsed(ctx, inst, f"get_default_device_pinned_mem_limit {row.ordinal}",
                        deadline, [], clientinfo.parse_mem_limit, None)
        if limit is not None:
            defaults.append((row.ordinal, limit[0]))
    return out, tuple(defaults)


def read_server(ctx: Context, inst: Instance, pid: int, deadline: float) -> ServerFact:
    ident = proc.identity(ctx.proc, pid)
    uid, start = ident if ident else (None, None)
    status_answer = control.ask(ctx, inst, f"get_server_status {pid}", deadline)
    if status_answer.status != "ok":
        return ServerFact(pid, "error", f"get_server_status: {status_answer.detail}", uid,
                          name_of(uid), start, ())
    try:
        status = parse_server_status(status_answer.stdout)
    except ParseError as e:
        return ServerFact(pid, "error", f"get_server_status: {e}", uid, name_of(uid), start, ())
    if status == "gone":
        return ServerFact(pid, "gone", "exited since the server list", uid, name_of(uid),
                          start, ())
    clients_answer = control.ask(ctx, inst, f"get_client_list {pid}", deadline)
    try:
        if clients_answer.status != "ok":
            raise ParseError(clients_answer.detail)
        if clients_answer.stdout.strip().endswith("not found"):
            return ServerFact(pid, "gone", "exited since the server list", uid,
                              name_of(uid), start, ())
        pids = parse_pid_list(clients_answer.stdout)
    except ParseError as e:
        return ServerFact(pid, status, f"get_client_list: {e}", uid, name_of(uid), start, ())
    return ServerFact(pid, status, "", uid, name_of(uid), start, read_clients(ctx, pids))


def read_instance(ctx: Context, inst: Instance, daemon: Tuple[Optional[int], Optional[int]]
                  ) -> InstanceServers:
    """The servers of an instance whose daemon (pid, start ticks: ``read_daemon``) may run
    some: asked of the daemon, one query at a time."""
    t0 = time.monotonic()
    daemon_pid, daemon_start = daemon
    timeout = ctx.config.control.timeout_s
    lock = control.pipe_lock(ctx, inst)
    if not lock.acquire(min(time.monotonic() + timeout, ctx.deadline)):
        return InstanceServers("skipped", "another mps-health query to this pipe dir did not "
                               "finish in time", daemon_pid, daemon_start, (),
                               time.monotonic() - t0)
    try:
        # Each query gets the control timeout; all of them together the run's deadline.
        listing = control.ask(ctx, inst, "get_server_list", ctx.deadline)
        if listing.status != "ok":
            return InstanceServers(listing.status, listing.detail, daemon_pid, daemon_start,
                                   (), time.monotonic() - t0)
        try:
            pids = parse_pid_list(listing.stdout)
        except ParseError as e:
            return InstanceServers("error", f"get_server_list: {e}", daemon_pid, daemon_start,
                                   (), time.monotonic() - t0)
        servers = []
        wedged = False
        for pid in pids:
            server = read_server(ctx, inst, pid, ctx.deadline)
            servers.append(server)
            if server.status == "error" and "no answer" in server.detail:
                wedged = True
                break  # wedged since the list: the next query would hang as well
        defaults: Tuple[Tuple[int, str], ...] = ()
        if servers and not wedged:
            servers, defaults = read_instance_details(ctx, inst, servers)
        return InstanceServers("ok", "", daemon_pid, daemon_start, tuple(servers),
                               time.monotonic() - t0, defaults)
    finally:
        lock.release()


def read_alive(ctx: Context, previous: Mapping[str, ServerMemory]) -> Tuple[Tuple[int, int], ...]:
    """Which clients of the previous run's servers still live (same pid and start)."""
    alive = []
    for memory in previous.values():
        for server in memory.servers:
            for pid, start in server.clients:
                ident = proc.identity(ctx.proc, pid)
                if ident is not None and ident[1] == start:
                    alive.append((pid, start))
    return tuple(sorted(set(alive)))


def _changed(before: Mapping[str, ServerMemory], after: Mapping[str, ServerMemory]) -> bool:
    """Worth a write? Not when only the time moved (an idle node writes nothing)."""
    def strip(m: Mapping[str, ServerMemory]) -> Dict[str, ServerMemory]:
        return {k: v._replace(taken_at=0.0) for k, v in m.items()}

    return strip(before) != strip(after)


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> ServersFacts:
    from .. import servertrack
    from ..planned import load as load_planned
    from ..state import StateFile

    cfg = settings(ctx.config)
    now = time.time()
    results: Dict[str, InstanceServers] = {}

    def one(inst: Instance, daemon: Tuple[Optional[int], Optional[int]]) -> None:
        results[inst.name] = read_instance(ctx, inst, daemon)

    # The cheap tier here; a thread each only for instances whose daemon has servers,
    # whose queries may wait on it. An idle node starts none: a thread reading two /proc
    # files beside this one would only trade the GIL with it.
    threads = []
    for inst in instances:
        t0 = time.monotonic()
        daemon_pid, daemon_start, busy = read_daemon(ctx, inst)
        if busy:
            threads.append(Background(one, inst, (daemon_pid, daemon_start)))
        else:
            results[inst.name] = InstanceServers(
                "idle", "the control daemon has no server process", daemon_pid,
                daemon_start, (), time.monotonic() - t0)
    state = StateFile(ctx.path(ctx.config.state_dir), "servers")
    locked = not ctx.read_only and state.lock(min(time.monotonic() + 1.0, ctx.deadline))
    previous, error = state.load("Dict[str, ServerMemory]", {}, globals()) \
        if not ctx.read_only else ({}, "")
    alive = read_alive(ctx, previous)
    for t in threads:
        t.join(ctx.remaining())
    for inst in instances:
        results.setdefault(inst.name, InstanceServers(
            "timeout", "no answer within the run's budget", None, None, (), 0.0))
    planned, planned_error = load_planned(ctx.config.state_dir)
    facts = ServersFacts(now, dict(results), previous, alive,
                         error or state.error or planned_error, planned)
    if locked:
        memory = {inst.name: servertrack.advance(previous.get(inst.name), results[inst.name],
                                                 alive, now, cfg.event_window_s, planned,
                                                 inst.pipe_dir)
                  for inst in instances}
        # Keep the memory of instances not seen this run (a per-job dir between jobs)
        # only for the window: their events still matter, their servers do not.
        for name, old in previous.items():
            if name not in memory and now - old.taken_at <= cfg.event_window_s:
                memory[name] = old
        saved = state.save(memory) if _changed(previous, memory) else ""
        state.unlock()
        if saved:
            facts = facts._replace(state_error=saved)
    return facts


VALUE_TYPE = "ServersFacts"  # read by codec, in this module's names
