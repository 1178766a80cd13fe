"""A function run in a thread of its own, joined against a deadline.

What the run needs of ``threading`` (start, join with a timeout, still running?) on
``_thread`` alone: ``threading`` imports more modules and builds its own bookkeeping,
most of a millisecond on every run slurmd makes. Like a daemon thread, one still
running when the run ends does not hold the process up.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


class Background:
    """``fn(*args)`` started now in a new thread; its exceptions are ``fn``'s to catch."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._running = _thread.allocate_lock()
        self._running.acquire()

        def body() -> None:
            try:
                fn(*args)
            finally:
                self._running.release()

        _thread.start_new_thread(body, ())

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` (none when not positive); True once ``fn`` returned."""
        if self._running.acquire(timeout=min(max(0.0, timeout_s), _thread.TIMEOUT_MAX)):
            self._running.release()
            return True
        return False
