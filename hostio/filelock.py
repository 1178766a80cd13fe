"""File locks: the one flock loop of mps-health.

A lock is a file under a root-owned dir, opened ``O_NOFOLLOW`` and flocked; waiting is
bounded by a deadline. The lock dies with its process (no stale lock after a crash);
the holder may write who it is into the file, so a waiter can name it. A lock named
after something users create (one per pipe dir) is ``transient``: its holder removes
the file before letting go, and a waiter that then wins the flock on the removed file
notices and starts over on the new one, so two holders never overlap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Optional


class LockBusy(Exception):
    """Another process holds the lock; the message names it."""


class FileLock:
    def __init__(self, path: str, transient: bool = False) -> None:
        self.path = path
        self.transient = transient  # remove the file on release (see the module doc)
        self.fd: Optional[int] = None

    def wait(self, deadline: float, what: str = "") -> bool:
        """Take the lock by ``deadline`` (monotonic); False if it is still held then.
        OSError if the lock file cannot be made. ``what`` is written for waiters to read."""
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):  # (makedirs raises and catches when it exists)
            os.makedirs(parent, mode=0o755, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                got = self._flock_by(fd, deadline)
            except OSError:
                os.close(fd)
                raise
            if not got:
                self._holder = _read_holder(fd)
                os.close(fd)
                return False
            if not self.transient or _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed it while we waited: take the new one
        if what:  # a note for waiters; a full disk loses the note, never the lock
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()}: {what}, since "
                         f"{time.strftime('%H:%M:%S')}\n".encode())
        self.fd = fd
        return True

    @staticmethod
    def _flock_by(fd: int, deadline: float) -> bool:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)

    def acquire(self, wait_s: float, what: str) -> FileLock:
        """Take the lock within ``wait_s`` or raise LockBusy naming the holder."""
        if not self.wait(time.monotonic() + wait_s, what):
            raise LockBusy(f"another remediation holds {self.path} ({self._holder}); "
                           f"waited {wait_s:g}s: try again when it has finished")
        return self

    def try_acquire(self, what: str) -> bool:
        """Take the lock only if it is free now."""
        return self.wait(0.0, what)

    def release(self) -> None:
        if self.fd is not None:
            if self.transient:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)  # still ours: we hold the flock on this very file
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    _holder = "holder unknown"


def node_lock(run_dir: str, name: str = "remediate") -> FileLock:
    """The node-wide lock ``name`` (remediation, the health check) in ``run_dir``."""
    return FileLock(os.path.join(run_dir, f"{name}.lock"))


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.stat(path, follow_symlinks=False), os.fstat(fd))
    except OSError:
        return False


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
