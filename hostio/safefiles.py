"""Small files root writes or reads: the one atomic writer and the one bounded reader.

``write_atomic`` (every file mps-health writes): the parent is reached by
``safedirs.open_dir`` (no untrusted link followed); the data goes to a random name
created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a planted name is never opened), is fsynced and
renamed over the target, replacing the entry itself (nothing planted there is followed):
a reader sees the old file or the new one.

``open_regular`` / ``read_small`` (every read: pid files in 0777 pipe dirs, state, /proc,
logs, the config): ``O_NONBLOCK`` (a planted FIFO cannot block the run), regular files
only, at most ``limit`` bytes; links refused (``O_NOFOLLOW``) except where an admin's or
root's own file may be one (``follow``: the config file, tmpfiles.d, gres.conf).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import List, Optional, Tuple

from mps_health.hostio.resources import raise_if_starved

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_atomic(path: str, data: bytes, mode: int = 0o644, root: str = "/") -> None:
    """Replace ``path`` (absolute, under ``root``) with ``data``; OSError if it cannot."""
    from mps_health.hostio.safedirs import open_dir, split  # lazy: readers never need it

    parent, name = split(path)
    pfd = open_dir(parent, root, guard=False)
    # A name no one can guess beforehand: os.urandom is what secrets.token_hex reads, and
    # secrets would load hmac, hashlib and random for it on every run that saves state.
    tmp = f".{name}.tmp-{os.urandom(8).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        with contextlib.suppress(OSError):  # some file systems refuse: fine
            os.fsync(pfd)  # the rename itself, durable
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=pfd)
        raise
    finally:
        os.close(pfd)


def open_regular(path: str, dir_fd: Optional[int] = None, follow: bool = False
                 ) -> Tuple[int, os.stat_result]:
    """(fd, stat) of regular file ``path``, opened ``O_NONBLOCK`` and, unless ``follow``,
    ``O_NOFOLLOW`` (a symlink: ELOOP). FileNotFoundError if missing; OSError if not a
    regular file or not openable; OutOfResources when this process has no descriptor (or
    memory) left: our trouble, never a fact about the file."""
    flags = READ_FLAGS & ~os.O_NOFOLLOW if follow else READ_FLAGS
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        raise_if_starved(e, f"open {path}")
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_upto(fd: int, limit: int, size_hint: int = 0) -> bytes:
    """At most ``limit + 1`` bytes from ``fd`` (one more tells "too long"), looping over
    short reads (procfs); reads are sized by ``size_hint`` (st_size), so a small file
    under a large limit never costs a buffer of the limit's size."""
    chunks: List[bytes] = []
    got = 0
    while got <= limit:
        chunk = os.read(fd, min(limit + 1 - got, max(size_hint + 1, 1 << 16)))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_small(path: str, limit: int = 1 << 20, follow: bool = False) -> Optional[bytes]:
    """The content of regular file ``path``; None if it does not exist. OSError if it is a
    link (ELOOP, unless ``follow``: a path an admin or root chose), not a regular file,
    longer than ``limit``, or unreadable."""
    try:
        fd, st = open_regular(path, follow=follow)
    except FileNotFoundError:
        return None
    try:
        data = b"" if st.st_size > limit else read_upto(fd, limit, st.st_size)
    finally:
        os.close(fd)
    if st.st_size > limit or len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
    return data


def read_tail(path: str, limit: int = 4096, owner: Optional[int] = None) -> Optional[bytes]:
    """The last ``limit`` bytes of regular file ``path`` (a log we quote from); None if it
    does not exist. OSError if it is a link, not a regular file, unreadable, or (with
    ``owner``) owned by another uid: a log another user wrote is not quoted as ours."""
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return None
    try:
        if owner is not None and st.st_uid != owner:
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, not by the daemon's "
                          f"user (uid {owner}): not read", path)
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        return read_upto(fd, limit - 1)
    finally:
        os.close(fd)
