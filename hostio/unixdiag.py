"""Who is connected to a unix socket: the kernel's sock_diag, as ``ss -x`` asks it.

A connection to an MPS control daemon's ``control`` socket (mode 0666: anyone's to open)
that sends nothing holds the daemon, which reads one connection at a time. The daemon's
end of an accepted connection carries the listening socket's path; its peer is an
unnamed socket that only the kernel ties to it (``UNIX_DIAG_PEER``). So: dump the
connected unix sockets with their names and peers over ``NETLINK_SOCK_DIAG``, keep those
on the wanted paths, and find the processes holding them by their ``/proc/PID/fd`` links.

No maintained Python library reads unix peers this way without bringing a netlink
framework with it (pyroute2's diag module is the nearest); the request is one struct and
the answer two, so they are read here with ``struct``, every length checked, the dump
bounded in bytes and time. Where a kernel refuses sock_diag (some sandboxes),
``proc_net_unix`` still lists the sockets on a path, without their peers.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Collection, Dict, Iterator, List, NamedTuple, Set, Tuple

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_PEER = 0x1, 0x4
UNIX_DIAG_NAME, UNIX_DIAG_PEER = 0, 2
TCP_ESTABLISHED = 1  # a unix socket's sk_state once connected (listeners: TCP_LISTEN)

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
_MESSAGE = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie[2]
_RTATTR = struct.Struct("=HH")  # len, type

# A node has thousands of unix sockets, not millions: past these the dump is cut short.
MAX_BYTES = 32 << 20
MAX_FDS_PER_PROCESS = 1 << 16


class UnixSocket(NamedTuple):
    inode: int
    path: str  # the bound path the socket carries ("" unnamed, "@..." abstract)
    peer: int  # the peer's inode; 0 when not known (proc_net_unix) or none


def request() -> bytes:
    """The dump request for connected unix sockets, with their names and peers."""
    body = _REQUEST.pack(socket.AF_UNIX, 0, 0, 1 << TCP_ESTABLISHED, 0,
                         UDIAG_SHOW_NAME | UDIAG_SHOW_PEER, 0xFFFFFFFF, 0xFFFFFFFF)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                          NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body  # seq 1: one per socket


def _attributes(data: bytes) -> Iterator[Tuple[int, bytes]]:
    at = 0
    while at + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, at)
        if length < _RTATTR.size or at + length > len(data):
            return
        yield kind, data[at + _RTATTR.size:at + length]
        at += (length + 3) & ~3


def parse(data: bytes) -> Tuple[List[UnixSocket], bool]:
    """(sockets, done) of one read of a dump's answer (pure); ValueError for an error
    message from the kernel."""
    found: List[UnixSocket] = []
    at = 0
    while at + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, at)
        if length < _NLMSGHDR.size or at + length > len(data):
            break
        body = data[at + _NLMSGHDR.size:at + length]
        at += (length + 3) & ~3
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
            if code:
                raise ValueError(os.strerror(-code))
            continue
        if kind != SOCK_DIAG_BY_FAMILY or len(body) < _MESSAGE.size:
            continue
        inode = _MESSAGE.unpack_from(body)[4]
        path, peer = "", 0
        for attr, value in _attributes(body[_MESSAGE.size:]):
            if attr == UNIX_DIAG_NAME:
                raw = value.split(b"\0", 1)[0] if value[:1] != b"\0" else b"@" + value[1:]
                path = raw.decode("utf-8", "surrogateescape")
            elif attr == UNIX_DIAG_PEER and len(value) >= 4:
                peer = struct.unpack_from("=I", value)[0]
        found.append(UnixSocket(inode, path, peer))
    return found, False


def connected(paths: Collection[str], timeout_s: float) -> List[UnixSocket]:
    """The connected sockets whose bound path is one of ``paths`` (a listener's accepted
    connections), with their peers; OSError where sock_diag cannot be read."""
    wanted = set(paths)
    deadline = time.monotonic() + max(0.05, timeout_s)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(max(0.05, timeout_s))
        nl.sendall(request())
        found: List[UnixSocket] = []
        total = 0
        while total < MAX_BYTES and time.monotonic() < deadline:
            data = nl.recv(1 << 16)
            total += len(data)
            if not data:
                break
            try:
                batch, done = parse(data)
            except ValueError as e:
                raise OSError(f"sock_diag: {e}") from None
            found += (s for s in batch if s.path in wanted)
            if done:
                return found
    raise OSError(f"sock_diag: the dump did not end within {MAX_BYTES >> 20} MiB "
                  f"or {timeout_s:g}s")


def parse_proc_net_unix(text: str, paths: Collection[str]) -> List[UnixSocket]:
    """The connected sockets (``St`` 03) on ``paths`` in ``/proc/net/unix`` (pure): the
    inodes only, no peer."""
    wanted = set(paths)
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[5] == "03" and fields[7] in wanted \
                and fields[6].isdigit():
            found.append(UnixSocket(int(fields[6]), fields[7], 0))
    return found


def proc_net_unix(proc_dir: str, paths: Collection[str]) -> List[UnixSocket]:
    from mps_health.hostio.safefiles import read_small

    data = read_small(f"{proc_dir}/net/unix", MAX_BYTES)
    return parse_proc_net_unix((data or b"").decode("utf-8", "surrogateescape"), paths)


def holders(proc_dir: str, inodes: Collection[int], deadline: float
            ) -> Tuple[Dict[int, List[int]], bool]:
    """({socket inode: pids holding it}, whether every process was looked at by
    ``deadline``). Links are read, never followed; a process that exits meanwhile, or
    whose fds may not be read, is passed over."""
    wanted: Set[str] = {f"socket:[{i}]" for i in inodes}
    found: Dict[int, List[int]] = {}
    try:
        pids = [int(n) for n in os.listdir(proc_dir) if n.isdigit()]
    except OSError:
        return found, False
    for pid in pids:
        if time.monotonic() >= deadline:
            return found, False
        fd_dir = f"{proc_dir}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names[:MAX_FDS_PER_PROCESS]:
            try:
                link = os.readlink(f"{fd_dir}/{name}")
            except OSError:
                continue
            if link in wanted:
                pids_of = found.setdefault(int(link[8:-1]), [])
                if pid not in pids_of:
                    pids_of.append(pid)
    return found, True

