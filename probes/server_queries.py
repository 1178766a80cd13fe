"""What a busy instance's daemon says of its servers, through the real client.

``get_server_list``, then each server's status, clients, limits and devices, and who each
client is (probes.clientinfo). One client run a query (its exit status says nothing: each
answer is parsed), all under the pipe dir's lock the control probe takes, so our queries
to one daemon never overlap. Not asked when the run's control query of the daemon went
unanswered (``queries.Queries``): a wedged daemon costs the run one timeout, not two.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

from mps_health.hostio.users import name_of
from mps_health.model.facts import Instance
from mps_health.model.facts_deep import ClientFact, DeviceFact, InstanceServers, ServerFact
from mps_health.probes import clientinfo, control, proc
from mps_health.probes.context import Context

T = TypeVar("T")

STATUSES = ("ACTIVE", "INITIALIZING", "FAULT")


def parse_pid_list(text: str) -> Tuple[int, ...]:
    """``get_server_list`` / ``get_client_list``: one PID a line; empty means none."""
    pids = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.isdigit():
            raise clientinfo.ParseError(f"expected one PID a line, got {line[:60]!r}")
        pids.append(int(line))
    return tuple(pids)


def parse_server_status(text: str) -> str:
    """``get_server_status PID``: ACTIVE, INITIALIZING, FAULT; "gone" for not found."""
    first = clientinfo.first_line(text)
    if first in STATUSES:
        return first
    if first.startswith("Server ") and first.endswith(" not found"):
        return "gone"
    raise clientinfo.ParseError(f"unexpected status {first[:60]!r}")


def read_clients(ctx: Context, pids: Tuple[int, ...]) -> Tuple[ClientFact, ...]:
    out: List[ClientFact] = []
    for pid in pids:
        ident = proc.identity(ctx.proc, pid)
        uid, start = ident if ident else (None, None)
        fact = ClientFact(pid, uid, name_of(uid), start)
        if ident is not None:
            fact = fact._replace(**clientinfo.read_client(ctx.proc, pid, start)._asdict())
        out.append(fact)
    return tuple(out)


def _parsed(ctx: Context, inst: Instance, command: str, errors: List[str],
            parse: Callable[[str], T], empty: T) -> T:
    """One detail query's answer through ``parse``; ``empty`` with a note in ``errors``
    when the query failed or its answer did not parse (named by the query's verb)."""
    answer = control.ask(ctx, inst, command, ctx.deadline)
    if answer.status != "ok":
        errors.append(f"{command}: {answer.detail or answer.status}")
        return empty
    try:
        return parse(answer.stdout)
    except clientinfo.ParseError as e:
        verb = command.split()[0]
        errors.append(str(e) if str(e).startswith(f"{verb}: ") else f"{verb}: {e}")
        return empty


def read_details(ctx: Context, inst: Instance, server: ServerFact,
                 devices: Tuple[clientinfo.DeviceRow, ...]) -> ServerFact:
    """The limits and devices of a running server: thread percentage, pinned memory
    limit and client contexts per device. A failed query leaves its field empty."""
    errors: List[str] = []
    pct: Optional[float] = _parsed(ctx, inst, f"get_active_thread_percentage {server.pid}",
                                   errors, clientinfo.parse_percentage, None)
    contexts: Dict[int, int] = _parsed(ctx, inst, f"get_device_client_list {server.pid}",
                                       errors, clientinfo.parse_device_clients, {})
    no_limit: Tuple[str, Optional[int]] = ("", None)
    facts = tuple(DeviceFact(row.ordinal, row.uuid, row.name, row.pci, *_parsed(
        ctx, inst, f"get_device_pinned_mem_limit {server.pid} {row.ordinal}", errors,
        clientinfo.parse_mem_limit, no_limit), contexts.get(row.ordinal)) for row in devices)
    return server._replace(thread_percentage=pct, devices=facts, detail_errors=tuple(errors))


def read_instance_details(ctx: Context, inst: Instance, servers: List[ServerFact]
                          ) -> Tuple[List[ServerFact], Tuple[Tuple[int, str], ...],
                              Tuple[Tuple[int, str], ...]]:
    """Per-server details, each client's GPUs from ``ps``, the default memory limits and
    the daemon's device table ((ordinal, UUID) of device_query's Default section)."""
    errors: List[str] = []
    table: Dict[str, Tuple[clientinfo.DeviceRow, ...]] = _parsed(
        ctx, inst, "device_query", errors, clientinfo.parse_device_query, {})
    rows: Tuple[clientinfo.PsRow, ...] = _parsed(ctx, inst, "ps", errors, clientinfo.parse_ps, ())
    out = []
    for server in servers:
        if server.status in ("gone", "error"):
            out.append(server)
            continue
        server = read_details(ctx, inst, server, table.get(str(server.pid), ()))
        clients = []
        for c in server.clients:
            mine = [r for r in rows if r.pid == c.pid and r.server == server.pid]
            clients.append(c._replace(gpus=tuple(dict.fromkeys(r.device for r in mine)),
                                      namespace=mine[0].namespace if mine else ""))
        out.append(server._replace(clients=tuple(clients),
                                   detail_errors=server.detail_errors + tuple(errors)))
    # A default limit that cannot be read or parsed is left out, without a note.
    defaults = tuple((row.ordinal, limit[0]) for row in table.get("default", ()) if (
        limit := _parsed(ctx, inst, f"get_default_device_pinned_mem_limit {row.ordinal}",
                         [], clientinfo.parse_mem_limit, None)) is not None)
    return out, defaults, tuple((row.ordinal, row.uuid) for row in table.get("default", ()))


def _stdout(ctx: Context, inst: Instance, command: str) -> str:
    """What ``command`` printed; ParseError with why when it got no answer."""
    answer = control.ask(ctx, inst, command, ctx.deadline)
    if answer.status != "ok":
        raise clientinfo.ParseError(answer.detail)
    return answer.stdout


def read_server(ctx: Context, inst: Instance, pid: int) -> ServerFact:
    ident = proc.identity(ctx.proc, pid)
    uid, start = ident if ident else (None, None)
    fact = ServerFact(pid, "error", "", uid, name_of(uid), start, ())
    gone = fact._replace(status="gone", detail="exited since the server list")
    try:
        status = parse_server_status(_stdout(ctx, inst, f"get_server_status {pid}"))
    except clientinfo.ParseError as e:
        return fact._replace(detail=f"get_server_status: {e}")
    if status == "gone":
        return gone
    try:
        listed = _stdout(ctx, inst, f"get_client_list {pid}")
        if listed.strip().endswith("not found"):
            return gone
        pids = parse_pid_list(listed)
    except clientinfo.ParseError as e:
        return fact._replace(status=status, detail=f"get_client_list: {e}")
    return fact._replace(status=status, clients=read_clients(ctx, pids))


def read_instance(ctx: Context, inst: Instance, daemon: Tuple[Optional[int], Optional[int]]
                  ) -> InstanceServers:
    """The servers of an instance whose daemon (pid, start ticks: ``read_daemon``) may run
    some: asked of the daemon, one query at a time."""
    t0 = time.monotonic()

    def ended(status: str, detail: str) -> InstanceServers:
        return InstanceServers(status, detail, *daemon, (), time.monotonic() - t0)

    if ctx.queries is not None:
        # The run's control query of this daemon first: once it went unanswered, asking
        # for the servers would only wait out a second timeout (servers-not-asked says why).
        why = ctx.queries.unanswered(inst.pipe_dir, ctx.deadline)
        if why:
            return ended("skipped", "not asked: " + why)
    lock = control.pipe_lock(ctx, inst)
    if not lock.acquire(min(time.monotonic() + ctx.config.control.timeout_s, ctx.deadline)):
        return ended("skipped", "another mps-health query to this pipe dir did not finish "
                     "in time")
    try:
        # Each query gets the control timeout; all of them together the run's deadline.
        listing = control.ask(ctx, inst, "get_server_list", ctx.deadline)
        if listing.status != "ok":
            return ended(listing.status, listing.detail)
        try:
            pids = parse_pid_list(listing.stdout)
        except clientinfo.ParseError as e:
            return ended("error", f"get_server_list: {e}")
        servers: List[ServerFact] = []
        defaults: Tuple[Tuple[int, str], ...] = ()
        devices: Tuple[Tuple[int, str], ...] = ()
        for pid in pids:
            servers.append(read_server(ctx, inst, pid))
            if servers[-1].status == "error" and "no answer" in servers[-1].detail:
                break  # wedged since the list: the next query would hang as well
        else:
            if servers:
                servers, defaults, devices = read_instance_details(ctx, inst, servers)
        return InstanceServers("ok", "", *daemon, tuple(servers), time.monotonic() - t0,
                               defaults, devices)
    finally:
        lock.release()
