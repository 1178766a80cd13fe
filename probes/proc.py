"""The MPS processes in the process table, read from /proc (under --root).

The kernel cuts daemon's and servers' ``comm`` to ``nvidia-cuda-mps``, so the role comes
from ``cmdline`` and the binary from ``exe`` (``mps_health.probes.process_identity``). A
zombie has an empty cmdline: role "unknown", state "Z".
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from mps_health.hostio.safefiles import open_regular, read_small
from mps_health.model.facts import ProcessFact
from mps_health.probes.context import Context
from mps_health.probes.process_identity import Binaries, binaries_for, genuine, role_of

if TYPE_CHECKING:
    from mps_health.model.facts import DirFact

COMM_PREFIX = "nvidia-cuda-mps"  # comm is cut at 15 characters
COMM_PREFIX_BYTES = COMM_PREFIX.encode()
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # what the daemon uses with no CUDA_MPS_PIPE_DIRECTORY
# environ and cmdline are at most ARG_MAX-sized on a real /proc (6 MiB with an unlimited
# stack); a --root tree's files are cut off there.
PROC_FILE_LIMIT = 8 << 20
# The variables of a process's environ that matter here (read by root and the owner only).
WANTED = ("SLURM_JOB_ID", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
          "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY")


class ParseError(ValueError):
    pass


def parse_stat(text: str) -> Tuple[str, str, int, int]:
    """``/proc/PID/stat`` -> (comm, state, ppid, start time in clock ticks)."""
    left, right = text.find("("), text.rfind(")")  # comm may hold spaces and parentheses
    if left < 0 or right < left:
        raise ParseError("no (comm) field in stat")
    rest = text[right + 1:].split()
    if len(rest) < 20:
        raise ParseError(f"stat has {len(rest) + 2} fields, expected at least 22")
    try:
        return text[left + 1:right], rest[0], int(rest[1]), int(rest[19])
    except ValueError:
        raise ParseError("stat has a non-numeric ppid or start time") from None


def parse_status_uid(text: str) -> int:
    """The real uid from ``/proc/PID/status``."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1])
    raise ParseError("no Uid: line in status")


def parse_status_traced(text: str) -> bool:
    """Whether ``/proc/PID/status`` names a tracer (``TracerPid:`` not 0)."""
    for line in text.splitlines():
        if line.startswith("TracerPid:"):
            value = line[len("TracerPid:"):].strip()
            return value.isdigit() and int(value) != 0
    return False


def parse_environ(data: bytes, truncated: bool = False) -> Dict[str, str]:
    """The ``WANTED`` variables of a NUL-separated environ; a cut last entry is dropped."""
    items = data.split(b"\0")[:-1] if truncated else data.split(b"\0")
    env: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in WANTED:
            env[name] = value.decode("utf-8", "replace")[:4096]
    return env


def _read(path: str) -> bytes:
    """A /proc file, whole (a --root tree's cut at PROC_FILE_LIMIT). Non-blocking, regular
    files only: a FIFO planted in a --root tree cannot block the run."""
    data = read_small(path, PROC_FILE_LIMIT)
    if data is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    return data


def read_text(path: str) -> str:
    """A /proc file (``_read``) as text."""
    return _read(path).decode("utf-8", "replace")


def _comm_matches(proc_dir: str, pid: int) -> bool:
    """The cheap first filter: /proc/PID/comm is far cheaper for the kernel than stat."""
    try:
        fd, _st = open_regular(f"{proc_dir}/{pid}/comm")
    except OSError:
        return False
    try:
        return os.read(fd, 64).startswith(COMM_PREFIX_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)


def identity(proc_dir: str, pid: int, uid: bool = True) -> Optional[Tuple[int, int]]:
    """(uid, or with ``uid=False`` the parent pid; start ticks) of any live process, or
    None when it is gone or unreadable."""
    try:
        _comm, state, ppid, start = parse_stat(read_text(f"{proc_dir}/{pid}/stat"))
        who = parse_status_uid(read_text(f"{proc_dir}/{pid}/status")) if uid else ppid
    except (OSError, ParseError):
        return None
    return None if state in ("Z", "X") else (who, start)


def read_process(proc_dir: str, pid: int, binaries: Optional[Binaries] = None
                 ) -> Optional[ProcessFact]:
    """The MPS process ``pid``, or None if it is not one (or is gone); whether it runs
    the configured binary is told only when ``binaries`` is given."""
    base = f"{proc_dir}/{pid}"
    try:
        comm, state, ppid, start = parse_stat(read_text(f"{base}/stat"))
        if not comm.startswith(COMM_PREFIX):
            return None
        cmdline = tuple(a.decode("utf-8", "replace") for a in _read(f"{base}/cmdline")
                        .split(b"\0") if a)
        status = read_text(f"{base}/status")
        uid = parse_status_uid(status)
    except (OSError, ParseError):
        return None  # exited while we looked, or not readable: not ours to judge
    pipe_dir: Optional[str] = None
    readable = True
    try:
        env = parse_environ(_read(f"{base}/environ"))
        pipe_dir = os.path.normpath(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    except OSError:
        readable = False  # environ is readable by root and the owner only
    if state == "Z":
        pipe_dir, readable = None, False
    role = role_of(cmdline)
    return ProcessFact(pid, ppid, state, uid, role, cmdline, start, pipe_dir, readable,
                       genuine(proc_dir, pid, role, binaries), parse_status_traced(status))


def read_processes(proc_dir: str, binaries: Optional[Binaries] = None,
                   clients_of: Optional[int] = None) -> Tuple[ProcessFact, ...]:
    """Every MPS process in ``proc_dir``, less the control clients ``clients_of`` started."""
    try:
        names = os.listdir(proc_dir)
    except OSError as e:
        raise OSError(f"cannot list {proc_dir}: {e.strerror}") from None
    facts = (read_process(proc_dir, int(name), binaries) for name in names
             if name.isdigit() and _comm_matches(proc_dir, int(name)))
    return tuple(sorted((f for f in facts if f is not None and not started_by(clients_of, f)),
                        key=lambda p: p.pid))


def started_by(own: Optional[int], fact: ProcessFact) -> bool:
    """Whether ``fact`` is a control client that process ``own`` started (a query of this
    run): not the node's. Only a client: a daemon's parent is whoever reaps orphans (init,
    a subreaper, the first process of a PID namespace or container), which may be us."""
    return own is not None and fact.ppid == own and fact.role == "client"


def binaries_here(ctx: Context) -> Optional[Binaries]:
    """The configured binaries to judge processes by; None under ``--root``, whose /proc
    is a copy (its binaries are not this host's)."""
    return binaries_for(ctx.config) if ctx.root in ("", "/") else None


VALUE_TYPE = Tuple[ProcessFact, ...]


def gather_for(ctx: Context, instances: object) -> Tuple[ProcessFact, ...]:
    """The node's MPS processes, less the control clients this run started meanwhile."""
    own = os.getpid() if ctx.root in ("", "/") else None
    return read_processes(ctx.proc, binaries_here(ctx), clients_of=own)


def with_named(ctx: Context, procs: Tuple[ProcessFact, ...], dirs: Mapping[str, DirFact]
               ) -> Tuple[ProcessFact, ...]:
    """``procs`` plus the live MPS process each pipe dir's pid file names, where the scan
    missed it: a daemon started (restarted) between the /proc scan and the pipe dir read
    would be judged ``daemon-stale`` while it serves. A healthy node reads nothing more."""
    found = {p.pid: p for p in procs}
    own = os.getpid() if ctx.root in ("", "/") else None
    for named in {d.pid_file for d in dirs.values()}:
        if named and named.isdigit() and len(named) <= 10 and int(named) not in found:
            fact = read_process(ctx.proc, int(named), binaries_here(ctx))
            if fact is not None and not started_by(own, fact):
                found[fact.pid] = fact
    return procs if len(found) == len(procs) else tuple(sorted(found.values(),
                                                               key=lambda p: p.pid))
