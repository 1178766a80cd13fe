"""External commands, always bounded: a timeout, then SIGKILL to the whole process group.

Every command starts in a new session (its own process group) with ``posix_spawn``,
so a client that forks, or hangs on a stopped MPS daemon, is killed with everything it
started. Nothing here uses a shell.

No command outlives the run: a new session is out of reach of a SIGKILL sent to us or
of slurmd's kill of our process group, so each command is started through util-linux's
``setpriv --pdeathsig KILL``, which asks the kernel (PR_SET_PDEATHSIG) to SIGKILL it the
moment the thread that started it dies, and then execs it (the setting survives exec;
a daemon that ``-d`` forks off is a new process and keeps running). The command is
looked up on PATH here first, so "not found" still names it, not setpriv.

Several commands can be started at once and collected against one deadline with one
poll loop, so N wedged daemons cost one timeout, not N, and each command is still timed
to its own end.

Why not ``subprocess``: importing it pulls in locale, re and enum, about 10 ms, which
is most of what the whole check may cost beyond starting Python (bench/check_speed.py).
"""

from __future__ import annotations

import os
import select
import time

from mps_health.hostio.resources import STARVED, OutOfResources, starved_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (
        Any,
        Callable,
        Dict,
        List,
        Mapping,
        NamedTuple,
        Optional,
        Sequence,
        Set,
        Tuple,
    )
else:
    from mps_health.model.frozen import NamedTuple

# The PATH root's commands are found on and daemons and job commands are started with:
# slurmd gives its programs and hooks an almost empty environment, and a user's PATH is
# never trusted. Only root-owned system dirs.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# signal.SIGKILL, without importing signal (it builds three enums at import, about half
# a millisecond on every run); 9 on every Linux architecture.
SIGKILL = 9

# The commands started and not yet reaped: a run abandoned at its hard limit kills those it
# started (engine.bounded), whichever thread started them.
_LIVE: Set[Pending] = set()

_SETPRIV = next((p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)),
                None)


def _resolve(name: str, env: Mapping[str, str]) -> str:
    """``name`` as execvp would find it; FileNotFoundError/PermissionError as it would."""
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d or ".", name)
                      for d in env.get("PATH", os.defpath).split(os.pathsep)]
    denied = False
    for path in candidates:
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = True
    if denied:
        raise PermissionError(13, "Permission denied", name)
    raise FileNotFoundError(2, "No such file or directory", name)


def dies_with_us(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """``argv`` wrapped so the kernel kills it when the thread that starts it dies."""
    path = _resolve(argv[0], env)
    if _SETPRIV is None:  # no util-linux: the deadline's group kill is all there is
        return [path, *argv[1:]]
    return [_SETPRIV, "--pdeathsig", "KILL", "--", path, *argv[1:]]


class Completed(NamedTuple):
    argv: List[str]
    rc: Optional[int]  # None when it timed out or could not start; -N when killed by signal N
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
    """A started command, to be collected with :meth:`wait` or :func:`wait_all`."""

    def __init__(self, argv: Sequence[str], stdin: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, user: Optional[int] = None,
                 group: Optional[int] = None, as_user: Optional[RunAs] = None) -> None:
        self.argv = list(argv)
        self._popen: Any = None
        self.started = time.monotonic()
        self.error: Optional[str] = None
        self.pid: Optional[int] = None
        self.out: Dict[int, bytearray] = {}
        self.ended: Optional[float] = None
        self.rc: Optional[int] = None
        # (errno, strerror) when it could not start for lack of our own fds or memory
        self.starved: Optional[Tuple[int, str]] = None
        try:
            if as_user is None and (user is not None or group is not None):
                as_user = RunAs(user if user is not None else os.getuid(),
                                group if group is not None else os.getgid())
            if as_user is None:
                self._spawn(stdin or "", env)
            else:
                self._spawn_as(stdin or "", env, as_user)
        except FileNotFoundError:
            self.error = f"{self.argv[0]}: command not found"
        except PermissionError:
            self.error = f"{self.argv[0]}: permission denied"
        except OSError as e:
            self.error = f"{self.argv[0]}: cannot run: {e.strerror}"
            if e.errno in STARVED:
                self.starved = (e.errno, e.strerror or "")
        if self.pid is not None:
            _LIVE.add(self)

    def _spawn(self, stdin: str, env: Optional[Mapping[str, str]]) -> None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        actions = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                   (os.POSIX_SPAWN_DUP2, err_w, 2)]
        environ = dict(os.environ if env is None else env)
        try:
            argv = dies_with_us(self.argv, environ)
            self.pid = os.posix_spawn(argv[0], argv, environ, file_actions=actions,
                                      setsid=True)
        except OSError:
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        # Feed stdin now, not at collection time: the client reads its command first and
        # must not wait on us while we collect another command. Commands are small.
        try:
            os.write(in_w, stdin.encode())
        except OSError:
            pass
        os.close(in_w)
        self.out = {out_r: bytearray(), err_r: bytearray()}
        self.fds = (out_r, err_r)

    def _spawn_as(self, stdin: str, env: Optional[Mapping[str, str]], who: RunAs) -> None:
        """As another user (root only): subprocess drops the ids in the child itself,
        with no shell, no su and no preexec_fn. Only remediation and the canary need it,
        so only they pay for importing subprocess."""
        import subprocess

        environ = dict(os.environ if env is None else env)
        proc = subprocess.Popen(
            dies_with_us(self.argv, environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ, start_new_session=True,
            close_fds=True, user=who.uid, group=who.gid, extra_groups=list(who.groups),
            cwd=who.cwd, umask=who.umask)
        self._popen = proc
        self.pid = proc.pid
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            os.write(proc.stdin.fileno(), stdin.encode())
        except OSError:
            pass
        proc.stdin.close()
        self.out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        self.fds = (proc.stdout.fileno(), proc.stderr.fileno())

    def _reap(self, block: bool) -> bool:
        """Collect the exit status; True once the process is gone."""
        if self.rc is not None or self.pid is None:
            return True
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.rc = -1
            _LIVE.discard(self)
            return True
        if pid == 0:
            return False
        self.rc = os.waitstatus_to_exitcode(status)
        _LIVE.discard(self)
        return True

    def finished(self) -> bool:
        """Has the command exited? (Its output can still be collected with wait.)"""
        return self._reap(block=False)

    def kill(self) -> None:
        """SIGKILL the command's whole process group (it leads its own session)."""
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def result(self, timed_out: bool) -> Completed:
        if self.pid is None:
            return Completed(self.argv, None, "", "", 0.0, exec_error=self.error)
        out, err = (bytes(self.out[fd]).decode("utf-8", "replace") for fd in self.fds)
        if self._popen is not None:  # its file objects own the fds
            self._popen.stdout.close()
            self._popen.stderr.close()
            self._popen.returncode = self.rc  # reaped here: Popen must not wait again
        else:
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        end = self.ended if self.ended is not None else time.monotonic()
        return Completed(self.argv, None if timed_out else self.rc, out, err,
                         end - self.started, timed_out)

    def wait(self, deadline: float,
             waiting: Optional[Callable[[List[Pending]], None]] = None) -> Completed:
        return wait_all([self], deadline, waiting)[0]


LEFT_PIPES_GRACE_S = 0.2  # how long to read a finished command's pipes that stay open
# A person at a terminal is told what a run waits for once a command has run this long
# (the ``waiting`` callback of wait_all); a healthy daemon answers in milliseconds.
WAITING_AFTER_S = 1.0


def wait_all(pending: Sequence[Pending], deadline: float,
             waiting: Optional[Callable[[List[Pending]], None]] = None) -> List[Completed]:
    """Collect several commands with one poll loop, killing what is left at ``deadline``.

    A command that exited while something it started (``nvidia-cuda-mps-control -d``'s
    daemon) still holds its stdout is collected shortly after its exit, not at EOF.
    ``waiting``, if given, is called once with the commands still running when the first
    of them has run ``WAITING_AFTER_S`` (and the deadline is not yet there).
    """
    poller = select.poll()
    owner: Dict[int, Pending] = {}
    for p in pending:
        if p.pid is not None:
            for fd in p.fds:
                poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                owner[fd] = p
    open_fds = {p: set(p.fds) for p in pending if p.pid is not None}
    exited: Dict[Pending, float] = {}
    while open_fds:
        now = time.monotonic()
        if waiting is not None and now < deadline \
                and now - min(p.started for p in open_fds) >= WAITING_AFTER_S:
            still = [p for p in pending if p in open_fds and p not in exited]
            if still:
                waiting(still)
            waiting = None
        for p in list(open_fds):  # finished, but its pipes were handed on: stop reading
            if p not in exited and p.finished():
                exited[p] = now
            if p in exited and now - exited[p] >= LEFT_PIPES_GRACE_S:
                for fd in open_fds.pop(p):
                    poller.unregister(fd)
                p.ended = exited[p]
        if not open_fds:
            break
        # A little grace past the deadline collects a command that already finished;
        # wake up now and then to notice a command that exited with its pipes held open.
        wait_ms = min(max(0, int((deadline - now) * 1000)) + 1, 50)
        events = poller.poll(wait_ms)
        if not events and time.monotonic() >= deadline:
            break
        for fd, _ in events:
            p = owner[fd]
            if p not in open_fds or fd not in open_fds[p]:
                continue
            chunk = os.read(fd, 65536)
            if chunk:
                p.out[fd] += chunk
                continue
            poller.unregister(fd)
            open_fds[p].discard(fd)
            if not open_fds[p]:
                del open_fds[p]
                _reap_until(p, deadline)
                p.ended = time.monotonic()
    results = []
    for p in pending:
        # A command that exited but left its pipes to a daemon it started has not timed out.
        timed_out = p.pid is not None and not p._reap(block=False)
        if timed_out:
            p.kill()
            p._reap(block=True)
        results.append(p.result(timed_out))
    for p in pending:
        if p.starved is not None:  # our own limit, never "not installed" or a broken daemon
            raise OutOfResources(starved_line(f"start {p.argv[0]}", *p.starved))
    return results


def kill_started_since(started: float) -> None:
    """SIGKILL every command started at or after ``started`` that is still running."""
    for p in list(_LIVE):
        if p.started >= started:
            p.kill()


def _reap_until(p: Pending, deadline: float) -> None:
    """The pipes closed; give the process until ``deadline`` to exit."""
    while not p._reap(block=False) and time.monotonic() < deadline:
        time.sleep(0.001)


def run(argv: Sequence[str], timeout_s: float, stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, as_user: Optional[RunAs] = None) -> Completed:
    """Run one command to completion or ``timeout_s``, whichever comes first."""
    return Pending(argv, stdin, env, as_user=as_user).wait(time.monotonic() + timeout_s)


def child_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """This process's environment plus ``extra`` (for CUDA_MPS_* and friends)."""
    env = dict(os.environ)
    env.update(extra)
    return env
