"""What the bench scripts share: one command's wall and CPU time, measured exactly."""

import os
import subprocess
import threading
import time
from typing import Dict, List, Tuple


def run_timed(argv: List[str], env: Dict[str, str], timeout: float = 60
              ) -> Tuple[float, int, float]:
    """(wall seconds, exit code, CPU seconds of user + system) of one run.

    A blocking wait4, not subprocess.run(timeout=...): its wait polls with growing sleeps
    (0.5 ms doubling to 50 ms), so every time it measures is rounded up to about 16, 32,
    64, 114, 164 ms. A timer kills a command that outlives ``timeout``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here
    return wall, p.returncode, usage.ru_utime + usage.ru_stime
