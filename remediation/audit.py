"""The audit trail: who did what to which instance, and how it ended.

Each line (``key=value`` pairs, for grep and log shippers alike) goes to syslog
(facility daemon, ident ``mps-health``) and the audit file (default
/var/log/mps-health/audit.log). "Who" is the person behind sudo (SUDO_USER, else the
login uid the kernel keeps across su and sudo), then the uid that acted. A failure to
write it is reported, never fatal: a repair must not be blocked by a full /var/log.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import syslog
import time
from typing import List, Mapping, Optional

from mps_health.hostio.safefiles import read_small
from mps_health.hostio.users import name_of
from mps_health.model.printable import printable

_UNSET_LOGINUID = 4294967295


def who(environ: Optional[Mapping[str, str]] = None) -> str:
    """'alice (via sudo, uid 0)', 'root', 'slurmd (healthcheck, uid 0)', ..."""
    environ = os.environ if environ is None else environ
    uid = os.getuid()
    acting = name_of(uid) or str(uid)
    if environ.get("SUDO_USER"):
        return f"{environ['SUDO_USER']} (via sudo as {acting})"
    try:
        login = int((read_small("/proc/self/loginuid", 64) or b"").strip() or _UNSET_LOGINUID)
    except (OSError, ValueError):
        login = _UNSET_LOGINUID
    if login not in (_UNSET_LOGINUID, uid):
        return f"{name_of(login) or login} (login uid {login}, as {acting})"
    return acting


def _quote(value: str) -> str:
    value = printable(value.replace("\\", "\\\\").replace('"', '\\"'))
    if value and all(c.isalnum() or c in "-_./:@,+" for c in value):
        return value
    return f'"{value}"'


def format_line(fields: Mapping[str, str]) -> str:
    return " ".join(f"{k}={_quote(str(v))}" for k, v in fields.items())


class Audit:
    """One action's audit trail; ``record`` writes a line per event."""

    def __init__(self, path: str, use_syslog: bool, node: str, action: str,
                 actor: Optional[str] = None) -> None:
        self.path = path
        self.use_syslog = use_syslog
        self.node = node
        self.action = action
        self.actor = actor if actor is not None else who()
        self.warned = False
        self.lines: List[str] = []

    def record(self, event: str, result: str = "", **detail: str) -> None:
        fields = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "node": self.node,
                  "who": self.actor, "action": self.action, "event": event}
        fields.update({k: v for k, v in {"result": result, **detail}.items() if v != ""})
        line = format_line(fields)
        self.lines.append(line)
        self._to_file(line)
        if self.use_syslog:
            syslog.openlog("mps-health", syslog.LOG_PID, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_NOTICE, line)

    def _to_file(self, line: str) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
            # O_NONBLOCK: a fifo in the log's place must not hang the action.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                os.write(fd, (line + "\n").encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError as e:
            if not self.warned:
                self.warned = True
                print(f"mps-health: warning: cannot write the audit log {self.path}: "
                      f"{e.strerror} (the action goes on)", file=sys.stderr)
