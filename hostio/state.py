"""What the deep checks remember between runs: small JSON files under ``state_dir``,
used by the probes that gather (never by checks or replay) under an flock. A file that
cannot be read starts the memory afresh, with one line saying why; a state dir that
cannot be written (not root) costs accuracy (no history), never correctness.
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

if TYPE_CHECKING:
    from mps_health.hostio.filelock import FileLock


def is_fault(note: str) -> bool:
    """Does a state note say the disk failed us (full, broken), not that this run is
    unprivileged or that an old file was damaged? The check says so in one line."""
    return note.startswith(("cannot save ", "cannot use state dir "))


class StateFile:
    """``state_dir/NAME.json`` and its lock ``NAME.lock`` (``lock``, then ``unlock``)."""

    def __init__(self, state_dir: str, name: str) -> None:
        self.dir = state_dir
        self.path = os.path.join(state_dir, name + ".json")
        self.lock_path = os.path.join(state_dir, name + ".lock")
        self._lock: Optional[FileLock] = None
        self.error = ""

    def lock(self, deadline: float) -> bool:
        """Take the lock by ``deadline``; False (with ``error`` set) if not."""
        from mps_health.hostio.filelock import FileLock

        self._lock = FileLock(self.lock_path)
        try:
            if self._lock.wait(deadline):
                return True
            self.error = f"{self.lock_path} is held by another run; state not saved"
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0:
                # Not root (check_mps as nagios, a user's -v): judged against root's
                # memory, only its own view is lost. What to do, not the errno.
                self.error = (f"read from {self.dir}, not saved: uid {os.geteuid()} may "
                              "not write there (run as root to save it)")
            elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                self.error = (f"{self.dir} is read-only for uid {os.geteuid()} "
                              f"({e.strerror}): read what root's runs keep there, "
                              "this run's own view is not saved")
            else:
                self.error = f"cannot use state dir {self.dir}: {e.strerror}"
        return False

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def update(self, wait_s: float, change: Callable[[], Any]) -> str:
        """Save ``change()`` (which reads the old value itself) under the lock, waiting up
        to ``wait_s``; '' or why not. A missing state dir is made (0755) for the Prolog."""
        try:
            os.makedirs(self.dir, mode=0o755, exist_ok=True)
        except OSError as e:
            return f"cannot use state dir {self.dir}: {e.strerror}"
        if not self.lock(time.monotonic() + wait_s):
            return self.error
        try:
            return self.save(change())
        finally:
            self.unlock()

    def load(self, value_type: Any, empty: Any) -> Tuple[Any, str]:
        """The saved value decoded as ``value_type`` (a type), or ``empty`` and why not."""
        from mps_health.hostio.safefiles import read_small
        from mps_health.model import codec

        try:
            raw = read_small(self.path, 4 << 20)
        except OSError as e:
            return empty, f"cannot read {self.path}: {e.strerror}; starting afresh"
        if raw is None:
            return empty, ""
        try:
            data = json.loads(raw.decode("utf-8"))
            return codec.decode(value_type, data, self.path), ""
        except (ValueError, RecursionError, codec.DecodeError) as e:
            return empty, f"{self.path} is damaged ({e}); starting afresh"

    def save(self, value: Any) -> str:
        """Write ``value`` atomically (``safefiles.write_atomic``); '' or why not."""
        from mps_health.hostio.safefiles import write_atomic
        from mps_health.model import codec

        try:
            write_atomic(os.path.abspath(self.path),
                         json.dumps(codec.encode(value), sort_keys=True).encode())
        except OSError as e:
            return f"cannot save {self.path}: {e.strerror}"
        return ""
