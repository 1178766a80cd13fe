"""Tripwire: record any file operation on the host's real mps-health state.

Tests must never read or write /var/lib/mps-health, /run/mps-health, /etc/slurm,
/var/log/mps-health (a repair's audit log), /tmp/nvidia-mps or /var/log/nvidia-mps (the
defaults a missing config key falls back to; the per-gpu defaults /tmp/nvidia-mps_N and
/var/log/nvidia-mps_N too). ``install(record)``
adds a Python audit hook that calls ``record(event, path)`` for an open, mkdir, rename,
remove, listdir, chmod... of such a path; tests/conftest.py installs it in the pytest
process, and sitecustomize.py here in every Python program the tests start (this folder
is put on PYTHONPATH), which append to the file named by MPS_HEALTH_TEST_TRIPWIRE. The
remediation audit trail sent to syslog is recorded too.
"""

import os
import sys
from typing import Callable

# /etc/mps-health is left out: a command run without --config opens its default config
# file there (none on a test machine); the fingerprint in tests/conftest.py sees a change.
FORBIDDEN = ("/var/lib/mps-health", "/run/mps-health", "/etc/slurm", "/var/log/mps-health")
FORBIDDEN_MPS = ("/tmp/nvidia-mps", "/var/log/nvidia-mps")  # and their _N per-gpu siblings
# The remediation audit trail's syslog ident: its lines go to the host's syslog (the job
# hooks' own idents, mps-health-prolog..., have no switch and are left alone).
AUDIT_IDENT = "mps-health"
# Set by a test that listens on /dev/log itself (no syslog daemon on the machine).
SYSLOG_LISTENED = "MPS_HEALTH_TEST_SYSLOG_LISTENED"
EVENTS = frozenset({
    "open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.listdir", "os.scandir",
    "os.chmod", "os.chown", "os.symlink", "os.link", "os.utime", "os.truncate",
    "shutil.rmtree", "shutil.copyfile", "shutil.move",
})


def forbidden(path: object) -> bool:
    if isinstance(path, bytes):
        path = path.decode("utf-8", "replace")
    if not isinstance(path, str) or not path.startswith("/"):
        return False
    path = os.path.normpath(path)
    return any(path == p or path.startswith(p + "/") for p in FORBIDDEN) or \
        any(path == p or path.startswith((p + "/", p + "_")) for p in FORBIDDEN_MPS)


def install(record: Callable[[str, str], None]) -> None:
    busy = []

    def hook(event: str, args: tuple) -> None:
        if event == "syslog.openlog" and args and args[0] == AUDIT_IDENT and not busy \
                and not os.environ.get(SYSLOG_LISTENED):
            busy.append(1)
            try:
                record(event, f"{AUDIT_IDENT} (the host's syslog: give the config "
                              "remediation.syslog false)")
            finally:
                busy.pop()
            return
        if event not in EVENTS or busy or not args:
            return
        for path in args[:2]:
            if forbidden(path):
                busy.append(1)
                try:
                    record(event, os.fsdecode(path))  # type: ignore[arg-type]
                finally:
                    busy.pop()
                return

    sys.addaudithook(hook)
