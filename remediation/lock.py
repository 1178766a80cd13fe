"""One flock per node serialises remediation; the holder writes who it is into the file.

A second ``remediate`` waits a bounded time and then fails, naming the holder, so two
admins (or an admin and the health check) never repair the same daemon at once. The
lock dies with its process: no stale lock to clean after a crash.
"""

import errno
import os
import time
from typing import Optional


class LockBusy(Exception):
    """Another process holds the lock; the message names it."""


class NodeLock:
    def __init__(self, run_dir: str, name: str = "remediate") -> None:
        self.path = os.path.join(run_dir, f"{name}.lock")
        self.fd: Optional[int] = None

    def acquire(self, wait_s: float, what: str) -> "NodeLock":
        """Take the lock within ``wait_s`` or raise LockBusy; OSError if it cannot be made."""
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise LockBusy(f"another remediation holds {self.path} ({holder}); "
                                   f"waited {wait_s:g}s: try again when it has finished") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {what}, since {time.strftime('%H:%M:%S')}\n".encode())
        self.fd = fd
        return self

    def try_acquire(self, what: str) -> bool:
        """Take the lock only if it is free now."""
        try:
            self.acquire(0.0, what)
        except LockBusy:
            return False
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "NodeLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
