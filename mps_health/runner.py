"""External commands, always bounded: a timeout, then SIGKILL to the whole process group.

Every command runs in a new session (its own process group), so a client that forks,
or hangs on a stopped MPS daemon, is killed with everything it started. Nothing here
uses a shell. Several commands can be started at once and collected against one
deadline, so N wedged daemons cost one timeout, not N.
"""

import contextlib
import os
import signal
import subprocess
import time
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple


class Completed(NamedTuple):
    argv: List[str]
    rc: Optional[int]  # None when it timed out or could not start
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool = False
    exec_error: Optional[str] = None  # why it could not start (not found, not executable)


class RunAs(NamedTuple):
    """Run a command as this user (the caller must be root), from ``cwd``, with ``umask``."""

    uid: int
    gid: int
    groups: Tuple[int, ...] = ()
    cwd: str = "/"
    umask: int = 0o022


class Pending:
    """A started command, to be collected with :meth:`wait`."""

    def __init__(self, argv: Sequence[str], stdin: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, as_user: Optional["RunAs"] = None,
                 ) -> None:
        self.argv = list(argv)
        self.started = time.monotonic()
        self.error: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        # Privileges are dropped by subprocess itself between fork and exec (setgroups,
        # setgid, setuid): no preexec_fn, no su/sudo with a command line to quote.
        drop: Dict[str, object] = {}
        if as_user is not None:
            drop = {"user": as_user.uid, "group": as_user.gid,
                    "extra_groups": list(as_user.groups), "cwd": as_user.cwd,
                    "umask": as_user.umask}
        try:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                self.argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # own process group: killed as a whole
                close_fds=True,
                **drop,
            )
        except FileNotFoundError:
            self.error = f"{self.argv[0]}: command not found"
        except PermissionError:
            self.error = f"{self.argv[0]}: permission denied"
        except OSError as e:
            self.error = f"{self.argv[0]}: cannot run: {e.strerror}"
        if self.proc is not None and self.proc.stdin is not None:
            # Feed stdin now, not at collection time: the client reads its command
            # first, and must not wait on us while we collect another command.
            try:
                self.proc.stdin.write((stdin or "").encode())
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.stdin = None

    def wait(self, deadline: float) -> Completed:
        """Collect the command, killing its process group if ``deadline`` passes."""
        if self.proc is None:
            return Completed(self.argv, None, "", "", 0.0, exec_error=self.error)
        try:
            # A little grace past the deadline collects a command that already finished.
            out, err = self.proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            try:
                out, err = self.proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # a child kept the pipes open: give up on them
                out, err = b"", b""
            elapsed = time.monotonic() - self.started
            return Completed(self.argv, None, _text(out), _text(err), elapsed, timed_out=True)
        elapsed = time.monotonic() - self.started
        return Completed(self.argv, self.proc.returncode, _text(out), _text(err), elapsed)


def wait_all(pending: Sequence[Pending], deadline: float) -> List[Completed]:
    """Collect several commands at once, each timed to its own end, all by ``deadline``."""
    if len(pending) <= 1:
        return [p.wait(deadline) for p in pending]
    import threading  # already imported by subprocess: costs nothing more

    done: List[Optional[Completed]] = [None] * len(pending)

    def collect(i: int) -> None:
        done[i] = pending[i].wait(deadline)

    threads = [threading.Thread(target=collect, args=(i,), daemon=True)
               for i in range(len(pending))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [d for d in done if d is not None]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (it was started in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def run(argv: Sequence[str], timeout_s: float, stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, as_user: Optional[RunAs] = None) -> Completed:
    """Run one command to completion or ``timeout_s``, whichever comes first."""
    return Pending(argv, stdin, env, as_user).wait(time.monotonic() + timeout_s)


def child_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """This process's environment plus ``extra`` (for CUDA_MPS_* and friends)."""
    env = dict(os.environ)
    env.update(extra)
    return env


def _text(data: Optional[bytes]) -> str:
    return (data or b"").decode("utf-8", "replace")
