"""Run a command as another user (a job's, a daemon's): no shell, no ``su -``, bounded.

Privileges are dropped by ``subprocess`` itself between fork and exec (setgroups,
setgid, setuid, umask, cwd): nothing is interpolated into a command line, no login shell
or PAM stack runs. The command leads its own session and is killed with its process
group at the timeout. Output goes to unlinked temporary files, not pipes (hence not the
core runner's loop): ``nvidia-cuda-mps-control -d`` leaves a daemon behind that may keep
its inherited descriptors, and a pipe would then never reach end-of-file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from typing import Mapping, Optional, Sequence

from mps_health.hostio.runner import SAFE_PATH, Completed, RunAs, start_error


def for_user(uid: int, gid: int, user: str) -> RunAs:
    """The job's user with the groups a login would have (only ``gid`` without an entry)."""
    from mps_health.hostio.users import User, groups_of

    return RunAs(uid, gid, groups_of(User(uid, gid, user)))


def user_env(as_user: RunAs, user: str, extra: Mapping[str, str]) -> dict:
    """A small clean environment for a command run as the job's user."""
    from mps_health.hostio.users import by_uid

    return {"PATH": SAFE_PATH, "HOME": by_uid(as_user.uid).home, "USER": user,
            "LOGNAME": user, "LANG": "C", **extra}


def run_as(argv: Sequence[str], timeout_s: float, as_user: Optional[RunAs],
           stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Completed:
    """Run ``argv`` as ``as_user`` (None: as we are) to completion or ``timeout_s``."""
    drop: dict = {}
    if as_user is not None:
        drop = {"cwd": as_user.cwd, "umask": as_user.umask}
        if (as_user.uid, as_user.gid) != (os.geteuid(), os.getegid()):
            drop.update(user=as_user.uid, group=as_user.gid,
                        extra_groups=list(as_user.groups))
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    env=dict(env) if env is not None else None,
                                    start_new_session=True, close_fds=True, **drop)
        except (OSError, subprocess.SubprocessError) as e:
            return Completed(list(argv), None, "", "", 0.0, exec_error=start_error(argv[0], e))
        timed_out = False
        try:
            proc.communicate((stdin or "").encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        elapsed = time.monotonic() - started
        texts = [os.pread(f.fileno(), 1 << 20, 0).decode("utf-8", "replace") for f in (out, err)]
    return Completed(list(argv), None if timed_out else proc.returncode, texts[0], texts[1],
                     elapsed, timed_out)
