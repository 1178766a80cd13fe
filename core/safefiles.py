"""Small files root writes or reads: the one atomic writer and the one bounded reader.

``write_atomic``: every file mps-health writes (snapshots, state, the textfile exporter's
output, the tmpfiles guard, the Slurm hooks, caches) goes through it. The parent is
reached by ``safedirs.open_dir`` (no untrusted link followed); the data
goes to a random name in that dir created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a name planted
in advance, link or not, is never opened), is fsynced and renamed over the target. A
reader sees the old file or the new one, never half of one, and nothing planted at the
target is followed: the rename replaces the entry itself.

``read_small``: every read of a file others could have replaced (pid files in 0777 pipe
dirs, state, caches, tmpfiles.d, the last textfile) opens it ``O_NOFOLLOW|O_NONBLOCK``
(a symlink is refused, a FIFO cannot block us), takes regular files only, and reads at
most ``limit`` bytes. The config and snapshots are read through it too
(``mps_health.inputs``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_atomic(path: str, data: bytes, mode: int = 0o644, root: str = "/",
                 owner: Optional[tuple] = None) -> None:
    """Replace ``path`` (absolute, under ``root``) with ``data``; OSError if it cannot."""
    from .safedirs import open_dir, split  # lazy: readers on the check's path never need it

    parent, name = split(path)
    pfd = open_dir(parent, root, guard=False)
    # os.urandom is what secrets.token_hex reads; secrets itself imports random, hashlib
    # and hmac (milliseconds on every check that saves state).
    tmp = f".{name}.tmp-{os.urandom(8).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        with contextlib.suppress(OSError):
            os.fsync(pfd)  # the rename itself, durable (some file systems refuse: fine)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=pfd)
        raise
    finally:
        os.close(pfd)


def read_small(path: str, limit: int = 1 << 20, dir_fd: Optional[int] = None,
               follow: bool = False) -> Optional[bytes]:
    """The content of regular file ``path``; None if it does not exist. OSError if it is a
    link (ELOOP), not a regular file, longer than ``limit``, or unreadable. ``follow``
    only for a path an admin chose (the config file): a symlink is then followed."""
    flags = READ_FLAGS & ~os.O_NOFOLLOW if follow else READ_FLAGS
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        # Reads sized by the file (procfs says 0 and gives short reads): a small file
        # under a large limit never costs a buffer of the limit's size.
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, max(st.st_size + 1, 1 << 16)))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_tail(path: str, limit: int = 4096) -> Optional[bytes]:
    """The last ``limit`` bytes of regular file ``path`` (a log we quote from); None if it
    does not exist. OSError if it is a link, not a regular file, or unreadable."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        data = b""
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)
