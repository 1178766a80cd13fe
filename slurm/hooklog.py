"""Where the job hooks say what they did: syslog (facility daemon, ident
``mps-health-prolog`` ...: slurmd keeps no hook output), stderr (for a hook run by hand),
optionally a file. Never stdout: slurmd reads the TaskProlog's as ``export`` lines. Every
line names the job; a log that cannot be written is skipped, never an error.
"""

import os
import sys
import syslog
import time
from contextlib import suppress
from functools import partialmethod
from typing import List, Optional

LEVELS = {"info": 6, "warning": 4, "error": 3}  # syslog priorities


class HookLog:
    def __init__(self, hook: str, job: str = "?", log_file: Optional[str] = None,
                 to_stderr: bool = True) -> None:
        self.ident = f"mps-health-{hook}"
        self.job = job
        self.log_file = log_file
        self.to_stderr = to_stderr
        self.lines: List[str] = []  # what was said, for the caller (and tests)
        self._syslog = None
        with suppress(OSError):
            syslog.openlog(self.ident, syslog.LOG_PID, syslog.LOG_DAEMON)
            self._syslog = syslog

    def _say(self, level: str, message: str) -> None:
        line = f"job {self.job}: {message}"
        self.lines.append(f"{level}: {line}")
        if self._syslog is not None:
            with suppress(OSError):
                self._syslog.syslog(LEVELS[level], line)
        if self.to_stderr:
            with suppress(OSError):
                print(f"{self.ident}: {level}: {line}", file=sys.stderr, flush=True)
        if self.log_file:
            self._append(f"{self.ident}[{os.getpid()}]: {level}: {line}\n")

    def _append(self, text: str) -> None:
        try:
            # O_NONBLOCK: a FIFO in the log's place must not hang a Prolog.
            fd = os.open(self.log_file or "", os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
        except OSError:
            return  # e.g. the TaskProlog, as the user, cannot write root's log: syslog has it
        try:
            with suppress(OSError):
                os.write(fd, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}".encode())
        finally:
            os.close(fd)

    info = partialmethod(_say, "info")
    warning = partialmethod(_say, "warning")
    error = partialmethod(_say, "error")
