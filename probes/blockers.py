"""What holds a control daemon that gave this run no answer: who, since when.

MPS lets any local user hold a node's control daemon: the daemon reads one connection
at a time, so a connection to its ``control`` socket (mode 0666) that sends nothing, or
half a command, makes every query and every new client of every user wait for as long
as it is held. So does an MPS server stopped with SIGSTOP (the instance's own, which
runs as its clients' user, or the world-executable server binary run by a user on the
pipe dir). This probe gathers the evidence, only for the daemons that did not answer
(``Queries.unanswered``: one timeout per wedge, nothing more on a healthy run):

* the daemon's accepted connections on ``<pipe dir>/control`` and the processes holding
  their peers (``hostio.unixdiag``: the kernel's sock_diag); where the kernel refuses
  that, the connections alone from ``/proc/net/unix``, and why the peer is unknown;
* the MPS processes on the pipe dir, to name a stopped server or daemon by user and job.

It also reads the node's recent unblock records (``hostio/unblocks``), so a uid that
blocks MPS again and again is named. Collected after the control and servers queries
(a source with a ``start``), so it sees what they could not ask.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from mps_health.hostio.unblocks import Unblocked
from mps_health.model.facts import Instance
from mps_health.probes.context import Context
from mps_health.probes.instances import pipe_paths

SHOWN_CONNECTIONS = 8  # a daemon reads one at a time: more than a few is already a flood


class Holder(NamedTuple):
    """A process, as it is named in a finding: who runs it, in which job, since when."""

    pid: int
    uid: int
    user: Optional[str]
    start_ticks: int
    state: str
    ppid: int
    comm: str
    job_id: Optional[str]
    started_at: Optional[float]  # epoch seconds


class Connection(NamedTuple):
    """One connection the daemon accepted on its control socket."""

    socket: int  # the daemon's end (inode)
    peer: int  # the other end's inode; 0 when the kernel could not be asked
    holders: Tuple[Holder, ...]  # the processes holding the peer


class Waiting(NamedTuple):
    """One instance's daemon that gave this run no answer, and what holds it."""

    unanswered: str  # why it is asked nothing more this run
    read: bool  # its connections were read (peers included)
    why: str  # why not, or what could not be read
    daemons: Tuple[int, ...]  # the pids holding the listening side's accepted sockets
    connections: Tuple[Connection, ...]
    processes: Tuple[Holder, ...]  # the MPS processes on its pipe dir, named


class BlockerFacts(NamedTuple):
    waiting: Dict[str, Waiting]  # instance name -> its unanswered daemon
    recent: Tuple[Unblocked, ...]  # the unblock records of the last day
    note: str = ""  # why the records could not be read


VALUE_TYPE = BlockerFacts


def start(ctx: Context, instances: Tuple[Instance, ...]) -> Callable[[], BlockerFacts]:
    """Nothing to start: collected last, once the control and servers queries are in."""
    return lambda: gather(ctx, instances)


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> BlockerFacts:
    from mps_health.hostio import unblocks

    queries = ctx.queries
    unanswered = {inst.name: why for inst in instances if (why := queries.unanswered(
        inst.pipe_dir, ctx.deadline) if queries is not None else "")}
    held = tuple(i for i in instances if i.name in unanswered)
    waiting = read_waiting(ctx, held, unanswered) if held else {}
    recent, note = unblocks.recent(ctx.path(ctx.config.state_dir), time.time())
    return BlockerFacts(waiting, recent, note)


def read_waiting(ctx: Context, held: Tuple[Instance, ...], unanswered: Dict[str, str]
                 ) -> Dict[str, Waiting]:
    """The evidence on the daemons of ``held``: their accepted connections' peers, their
    processes. One /proc scan, one socket dump and one look at every process's fds serve
    them all, within half a second past the run's deadline (a wedge's timeout is spent)."""
    from mps_health.hostio import unixdiag
    from mps_health.probes.proc import binaries_here, read_processes

    deadline = max(ctx.deadline, time.monotonic() + 0.5)
    paths = {inst.name: [os.path.join(p, "control") for p in pipe_paths(inst, ctx.root)]
             for inst in held}
    dirs = {os.path.dirname(x) for each in paths.values() for x in each}
    procs = tuple(p for p in read_processes(ctx.proc, binaries_here(ctx)) if p.pipe_dir in dirs)
    named = {p.pid: h for p in procs if (h := holder(ctx, p.pid)) is not None}
    sockets: List[unixdiag.UnixSocket] = []
    why = ""
    if ctx.root not in ("", "/"):
        why = "connections are not read under --root"
    else:
        wanted = [x for each in paths.values() for x in each]
        try:
            sockets = unixdiag.connected(wanted, max(0.05, deadline - time.monotonic()))
        except OSError as e:
            why = f"the kernel gave no socket peers ({e}): the holder cannot be named"
            try:
                sockets = unixdiag.proc_net_unix(ctx.proc, wanted)
            except OSError as e2:
                why += f"; /proc/net/unix: {e2.strerror or e2}"
    inodes = [s.inode for s in sockets] + [s.peer for s in sockets if s.peer]
    fds, whole = unixdiag.holders(ctx.proc, inodes, deadline) if inodes else ({}, True)
    if not whole:
        why = "; ".join(filter(None, (why, "not every process could be looked at in time")))
    if os.geteuid() != 0:  # another user's /proc/PID/fd is root's to read
        why = why or "only root may read the daemon's connections: run as root to name them"
    out = {}
    for inst in held:
        mine = tuple(p for p in procs if p.pipe_dir in {os.path.dirname(x)
                                                          for x in paths[inst.name]})
        daemons = {p.pid for p in mine if p.role == "control"}
        # Only its daemon's accepted connections count (a socket no process holds is gone).
        accepted = [s for s in sockets if s.path in paths[inst.name]
                    and (set(fds.get(s.inode, ())) & daemons if daemons else fds.get(s.inode))]
        out[inst.name] = Waiting(
            unanswered[inst.name], not why, why,
            tuple(sorted({pid for s in accepted for pid in fds.get(s.inode, ())})),
            tuple(Connection(s.inode, s.peer, tuple(
                h for h in (holder(ctx, pid) for pid in fds.get(s.peer, ())[:4]) if h))
                for s in accepted[:SHOWN_CONNECTIONS]),
            tuple(named[p.pid] for p in mine if p.pid in named))
    return out


def holder(ctx: Context, pid: int) -> Optional[Holder]:
    """``pid`` named: uid and user, Slurm job (``clientinfo.read_client``'s rule, as for
    any client: its job cgroup, else its environment's claim), state, start; None when it
    is gone."""
    from mps_health.hostio.users import name_of
    from mps_health.probes.clientinfo import read_client
    from mps_health.probes.proc import ParseError, parse_stat, parse_status_uid, read_text

    base = f"{ctx.proc}/{pid}"
    try:
        comm, state, ppid, start = parse_stat(read_text(f"{base}/stat"))
        uid = parse_status_uid(read_text(f"{base}/status"))
    except (OSError, ParseError):
        return None
    job = read_client(ctx.proc, pid, start).job_id or None
    return Holder(pid, uid, name_of(uid), start, state, ppid, comm, job, started_at(ctx, start))


def started_at(ctx: Context, start_ticks: int) -> Optional[float]:
    """A process's start in epoch seconds, from its start ticks and the boot time."""
    from mps_health.hostio.safefiles import read_small

    try:
        text = (read_small(f"{ctx.proc}/stat", 1 << 22) or b"").decode("ascii", "replace")
        boot = next(int(line.split()[1]) for line in text.splitlines()
                    if line.startswith("btime "))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None

