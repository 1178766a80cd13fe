"""NHC's detached mode: answer slurmd at once with the last result, check in a child.

The result file (``run_dir/healthcheck.result``, tmpfs) holds the exit status, the boot
id and the time it was written, then the output; one from another boot, or older than
``result_ttl_s``, is not reported. slurmd reads our output to EOF and then kills our
process group, so the child leaves both (``spawn``).
"""

from __future__ import annotations

import os
import time
from typing import Callable, NamedTuple, Optional

from mps_health.hostio.safefiles import read_small, write_atomic

RESULT_FILE = "healthcheck.result"


class StoredResult(NamedTuple):
    rc: int
    boot_id: str
    written_at: float
    text: str


def boot_id(proc: str = "/proc") -> str:
    try:
        data = read_small(f"{proc}/sys/kernel/random/boot_id", 64)
    except OSError:
        return "unknown"
    return data.decode("ascii", "replace").strip() if data else "unknown"


def parse_result(data: str) -> Optional[StoredResult]:
    head, _, text = data.partition("\n")
    try:
        rc, boot, written_at = head.split()
        return StoredResult(int(rc), boot, float(written_at), text.rstrip("\n"))
    except ValueError:  # not three fields, or not numbers
        return None


def format_result(rc: int, boot: str, written_at: float, text: str) -> str:
    return f"{rc} {boot} {written_at:.3f}\n{text}\n"


def read_result(path: str) -> Optional[StoredResult]:
    try:
        data = read_small(path, 65536)
    except OSError:
        return None
    return None if data is None else parse_result(data.decode("utf-8", "replace"))


def current(result: Optional[StoredResult], boot: str, now: float, ttl_s: float
            ) -> Optional[StoredResult]:
    """The result if it is from this boot and fresh enough, else None."""
    fresh = result is not None and result.boot_id == boot and 0 <= now - result.written_at <= ttl_s
    return result if fresh else None


def write_result(path: str, rc: int, boot: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, format_result(rc, boot, time.time(), text).encode(), 0o644)


def spawn(work: Callable[[], int]) -> int:
    """Run ``work`` in a grandchild outside our session; returns the first child's PID
    (already reaped). ``work`` must not return into the caller's code: we _exit."""
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return first
    try:
        os.setsid()  # out of slurmd's process group: its kill after we exit misses us
        if os.fork():  # the grandchild leads no session: it can never take a terminal back
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # let go of slurmd's pipes: it reads them to EOF
        os.closerange(3, 256)  # devnull too, when it is not one of 0, 1, 2
        os.chdir("/")
        code = work()
    except BaseException:
        code = 3
    os._exit(code)
