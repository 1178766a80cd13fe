"""Log lines a client can cause, rate-limited: one line per kind and interval, with a count.

Anyone who can reach the port decides how often these happen, so each kind is written at
once the first time, then counted and summed up at most once per interval: a flood of any
size gives a few lines a minute, never megabytes of stderr.
"""

import contextlib
import sys
import time
from typing import Callable, Dict, Optional


def to_stderr(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr gone: the server goes on
        print(line, file=sys.stderr, flush=True)


class Throttled:
    """``note(kind, what)`` per event; ``flush()`` often (it writes only what is due)."""

    def __init__(self, interval_s: float, write: Callable[[str], None] = to_stderr,
                 clock: Callable[[], float] = time.monotonic,
                 prefix: str = "mps-health exporter: ") -> None:
        self.interval_s, self.write, self.clock, self.prefix = interval_s, write, clock, prefix
        self.counts: Dict[str, int] = {}
        self.what: Dict[str, str] = {}
        self.written: Dict[str, float] = {}  # when the kind's last line was written

    def note(self, kind: str, what: str) -> None:
        now = self.clock()
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.what[kind] = what
        last = self.written.get(kind)
        if last is None or now - last >= self.interval_s:
            self.emit(kind, now)

    def emit(self, kind: str, now: float) -> None:
        count = self.counts.pop(kind)
        last = self.written.get(kind)
        self.written[kind] = now
        if last is None:
            tail = f"{count} so far; more are counted, one line per {self.interval_s:g}s"
        else:
            tail = f"{count} in the last {max(now - last, 0.0):.0f}s"
        self.write(f"{self.prefix}{self.what[kind]} ({tail})")

    def flush(self, final: bool = False, now: Optional[float] = None) -> None:
        """Write the counts whose interval has passed (all of them when ``final``)."""
        now = self.clock() if now is None else now
        for kind in list(self.counts):
            if final or now - self.written.get(kind, now - self.interval_s) >= self.interval_s:
                self.emit(kind, now)
