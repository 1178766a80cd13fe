"""File locks: the one flock loop of mps-health (remediation, the health check, the
probes' state files, queries to one pipe dir).

A lock is a file under a root-owned dir (``run_dir``, ``state_dir``), opened
``O_NOFOLLOW`` and flocked; waiting is bounded by a deadline, never forever. The lock
dies with its process (closing the fd drops it): no stale lock to clean after a crash.
The holder may write who it is into the file, so a waiter can name it.
"""

import os
import time
from typing import Optional


class LockBusy(Exception):
    """Another process holds the lock; the message names it."""


class FileLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: Optional[int] = None

    def wait(self, deadline: float, what: str = "") -> bool:
        """Take the lock by ``deadline`` (monotonic); False if it is still held then.
        OSError if the lock file cannot be made. ``what`` is written for waiters to read."""
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._holder = _read_holder(fd)
                    os.close(fd)
                    return False
                time.sleep(0.01)
            except OSError:
                os.close(fd)
                raise
        if what:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}: {what}, since {time.strftime('%H:%M:%S')}\n"
                     .encode())
        self.fd = fd
        return True

    def acquire(self, wait_s: float, what: str) -> "FileLock":
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
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "FileLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    _holder = "holder unknown"


def node_lock(run_dir: str, name: str = "remediate") -> FileLock:
    """The node-wide lock ``name`` (remediation, the health check) in ``run_dir``."""
    return FileLock(os.path.join(run_dir, f"{name}.lock"))


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
