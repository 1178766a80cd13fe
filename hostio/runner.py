"""External commands, always bounded: a timeout, then SIGKILL to the whole process group.

Every command leads a new session (its own process group), so a client that forks, or
hangs on a stopped MPS daemon, is killed with all it started. No shell. A new session is
out of reach of a SIGKILL sent to us or of slurmd's kill of our group, so, lest it
outlive the run, each starts through util-linux's ``setpriv --pdeathsig KILL``
(PR_SET_PDEATHSIG, kept across exec: the kernel SIGKILLs it when the thread that started
it dies; a daemon that ``-d`` forks off keeps running). It is looked up on PATH here
first, so "not found" names it. A command gets its stdin only once ``setpriv`` has exec'd
it, so with that signal set: one whose parent died before (a kill landing between fork
and ``prctl``, which the kernel never reports to it) reads end-of-file instead of the
command it would hang on, and exits.

``wait_all`` collects several commands against one deadline, each in its own thread, so
N wedged daemons cost one timeout, not N; one still running there is killed with its
group and reaped. One that exited while something it started (``nvidia-cuda-mps-control
-d``'s daemon) still holds its stdout is collected shortly after its exit, not killed:
it did not time out.

A file that is there but cannot run here (another architecture, no program at all, its
interpreter, loader or a library missing) is an ``exec_error`` saying so
(``hostio.executable``), never run through ``/bin/sh`` nor taken for its own failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from mps_health.hostio.executable import start_failure, why_not_runnable
from mps_health.hostio.resources import STARVED, OutOfResources, starved_line

# The PATH (root-owned system dirs only) of root's commands, daemons and job commands:
# slurmd gives its hooks an almost empty environment, and a user's PATH is never trusted.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The commands started and not yet reaped: a run abandoned at its hard limit kills those it
# started (engine.bounded), whichever thread started them.
_LIVE: Set[Pending] = set()

_SETPRIV = next((p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)),
                None)

# A command is fed its stdin only once setpriv has exec'd it (its parent-death signal
# set): the start waits ARMED_WAIT_S for that, then a feeder thread waits on, at most
# LATE_ARMED_S (the command's deadline kills it long before).
ARMED_WAIT_S = 0.1
ARMED_POLL_S = 0.0005
LATE_ARMED_S = 120.0
LATE_POLL_S = 0.005
LEFT_PIPES_GRACE_S = 0.2  # how long to read a finished command's pipes that stay open
POLL_S = 0.05  # how often a wait wakes up to notice one that exited, its pipes held open
# A person at a terminal is told what a run waits for once a command has run this long
# (the ``waiting`` callback of wait_all); a healthy daemon answers in milliseconds.
WAITING_AFTER_S = 1.0


def _resolve(name: str, env: Mapping[str, str]) -> str:
    """``name`` as execvp would find it; FileNotFoundError/PermissionError as it would."""
    # Not shutil.which (nor for _SETPRIV): every healthy run starts the control client,
    # and shutil would import bz2, lzma and zlib into it; which also loses denied vs absent.
    paths = [name] if "/" in name else [
        os.path.join(d or ".", name) for d in env.get("PATH", os.defpath).split(os.pathsep)]
    denied = False
    for path in filter(os.path.isfile, paths):
        if os.access(path, os.X_OK):
            broken = why_not_runnable(path)
            if broken is not None:  # said now: setpriv's execvp would run it with /bin/sh
                raise CannotRun(broken[0], broken[1], path)
            return path
        denied = True
    if denied:
        raise PermissionError(13, "Permission denied", name)
    raise FileNotFoundError(2, "No such file or directory", name)


def dies_with_us(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """``argv`` wrapped so the kernel kills it when the thread that starts it dies."""
    # Without util-linux's setpriv the deadline's group kill is all there is.
    wrap = [] if _SETPRIV is None else [_SETPRIV, "--pdeathsig", "KILL", "--"]
    return [*wrap, _resolve(argv[0], env), *argv[1:]]


def _armed(pid: int, wrapper: str, wait_s: float, poll_s: float) -> bool:
    """True once ``pid`` no longer runs ``wrapper`` (it exec'd the command, its
    parent-death signal set) or has exited; False if it still runs it after ``wait_s``."""
    until = time.monotonic() + wait_s
    while True:
        try:
            if os.readlink(f"/proc/{pid}/exe") != wrapper:
                return True
        except OSError:  # exited (a zombie has no exe) or not ours to see: nothing to wait for
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(poll_s)


def _feed(pipe: IO[bytes], data: bytes, armed: bool = True) -> None:
    """Write ``data`` (when ``armed``) and close: a command that exited without reading
    has its output say why."""
    with contextlib.suppress(OSError):
        if armed:
            pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _feed_when_armed(pid: int, pipe: IO[bytes], data: bytes) -> None:
    """Feed ``data`` to ``pid`` once setpriv has exec'd it. Never before: a command
    orphaned between its fork and setpriv's prctl would then read its query and hang
    for good, with no parent-death signal; fed nothing, it reads end-of-file and exits."""
    wrapper = os.path.realpath(_SETPRIV) if _SETPRIV is not None else None
    if wrapper is None or not data or _armed(pid, wrapper, ARMED_WAIT_S, ARMED_POLL_S):
        _feed(pipe, data)
        return
    # A slow machine: wait on in a thread, not here, so other commands still start. It
    # dies with us, and with it the pipe's last writer.
    late = threading.Thread(target=lambda: _feed(
        pipe, data, _armed(pid, wrapper, LATE_ARMED_S, LATE_POLL_S)), daemon=True,
        name=f"feed {pid}")
    try:
        late.start()
    except RuntimeError:  # no thread to be had (our own limits): end-of-file, not a risk
        _feed(pipe, data, armed=False)


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


class CannotRun(OSError):
    """The file is there and executable, but cannot run here (``hostio.executable``)."""


def start_error(name: str, e: Exception) -> str:
    """The one line saying why command ``name`` could not start."""
    if isinstance(e, CannotRun):
        return f"{name}: cannot run: {e.strerror}"
    if isinstance(e, OSError) and e.errno in (errno.ENOENT, errno.ENOEXEC) \
            and os.path.isfile(name):  # the file is there: its loader or format is not
        return f"{name}: cannot run: {e.strerror}"
    if isinstance(e, FileNotFoundError):
        return f"{name}: command not found"
    if isinstance(e, PermissionError):
        return f"{name}: permission denied"
    return f"{name}: cannot run: {getattr(e, 'strerror', None) or e}"


def _taken(proc: subprocess.Popen[bytes]) -> Tuple[bytes, bytes]:
    """What ``proc`` wrote, read a moment more: all of it once its pipes closed, what came
    so far while something still holds them."""
    try:
        out, err = proc.communicate(timeout=0.001)
        return out or b"", err or b""
    except subprocess.TimeoutExpired as e:
        return e.output or b"", e.stderr or b""


class Pending:
    """A started command, to be collected with :meth:`wait` or :func:`wait_all`."""

    def __init__(self, argv: Sequence[str], stdin: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, user: Optional[int] = None,
                 group: Optional[int] = None) -> None:
        self.argv = list(argv)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.started = time.monotonic()
        self.error: Optional[str] = None
        self.pid: Optional[int] = None
        self.ended: Optional[float] = None
        self.rc: Optional[int] = None
        self.timed_out = False
        self.collected = False
        self._out = (b"", b"")
        # (errno, strerror) when it could not start for lack of our own fds or memory
        self.starved: Optional[Tuple[int, str]] = None
        try:
            as_user = None if user is None and group is None else RunAs(
                user if user is not None else os.getuid(),
                group if group is not None else os.getgid())
            self._start(stdin or "", env, as_user)
        except (OSError, subprocess.SubprocessError) as e:
            self.error = start_error(self.argv[0], e)
            if isinstance(e, OSError) and e.errno in STARVED:
                self.starved = (e.errno, e.strerror or "")
        if self.pid is not None:
            _LIVE.add(self)

    def _start(self, stdin: str, env: Optional[Mapping[str, str]], who: Optional[RunAs]
               ) -> None:
        environ = dict(os.environ if env is None else env)
        # As another user (root only): subprocess drops the ids in the child itself, with
        # no shell, no su and no preexec_fn.
        drop = {} if who is None else {
            "user": who.uid, "group": who.gid, "extra_groups": list(who.groups),
            "cwd": who.cwd, "umask": who.umask}
        proc = subprocess.Popen(  # type: ignore[call-overload]
            dies_with_us(self.argv, environ), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ,
            start_new_session=True, close_fds=True, **drop)
        self.proc, self.pid = proc, proc.pid
        # Feed stdin now, not at collection time: the client reads its command first and
        # must not wait on us while we collect another command. Commands are small.
        pipe, proc.stdin = proc.stdin, None  # ours to feed: communicate sends nothing
        assert pipe is not None
        _feed_when_armed(proc.pid, pipe, stdin.encode())

    def finished(self) -> bool:
        """Has the command exited? (Its output can still be collected with wait.)"""
        return self.proc is None or self.proc.poll() is not None

    def kill(self) -> None:
        """SIGKILL the command's whole process group (it leads its own session)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def collect(self, deadline: float) -> None:
        """Read the command's output until it ends; at ``deadline`` kill it if it still
        runs. Collecting again does nothing."""
        proc = self.proc
        if proc is None or self.collected:
            return
        exited_at: Optional[float] = None
        while True:
            # A little grace past the deadline collects a command that already finished.
            wait_s = min(max(0.0, deadline - time.monotonic()), POLL_S) + 0.001
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._out = proc.communicate(timeout=wait_s)
                self.ended = time.monotonic()
                break
            now = time.monotonic()
            if proc.poll() is not None:
                # It exited, and something it started still holds its pipes: stop
                # reading a moment after its exit (or at the deadline).
                exited_at = now if exited_at is None else exited_at
                if now - exited_at >= LEFT_PIPES_GRACE_S or now >= deadline:
                    self._out = _taken(proc)
                    self.ended = exited_at
                    break
            elif now >= deadline:
                self.timed_out = True
                self.kill()
                proc.wait()
                self._out = _taken(proc)
                break
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()  # left to whatever the command started: no more reads
        self.rc = proc.returncode
        _LIVE.discard(self)
        self.collected = True

    def result(self) -> Completed:
        if self.proc is None:
            return Completed(self.argv, None, "", "", 0.0, exec_error=self.error)
        out, err = (b.decode("utf-8", "replace") for b in self._out)
        end = self.ended if self.ended is not None else time.monotonic()
        never_ran = None if self.timed_out else start_failure(self.rc, err)
        return Completed(self.argv, None if self.timed_out else self.rc, out, err,
                         end - self.started, self.timed_out,
                         f"{self.argv[0]}: cannot run: {never_ran}" if never_ran else None)

    def wait(self, deadline: float,
             waiting: Optional[Callable[[List[Pending]], None]] = None) -> Completed:
        return wait_all([self], deadline, waiting)[0]


def _collector(p: Pending, deadline: float) -> Optional[threading.Thread]:
    """A thread collecting ``p``; None when no thread can be had (our own limits): the
    caller collects it in turn then."""
    t = threading.Thread(target=p.collect, args=(deadline,), name=f"collect {p.argv[0]}",
                         daemon=True)
    with contextlib.suppress(RuntimeError):
        t.start()
        return t
    return None


def wait_all(pending: Sequence[Pending], deadline: float,
             waiting: Optional[Callable[[List[Pending]], None]] = None) -> List[Completed]:
    """Collect several commands against one deadline, killing what still runs there.
    ``waiting``, if given, is called once with those still running when the first has run
    ``WAITING_AFTER_S`` (before the deadline)."""
    todo = [p for p in pending if p.proc is not None and not p.collected]
    # The first is collected in this thread, unless someone must be told of a long wait.
    here = todo[:1] if waiting is None else []
    helpers = [(p, _collector(p, deadline)) for p in todo[len(here):]]
    threads = [t for _, t in helpers if t is not None]
    here += [p for p, t in helpers if t is None]
    if todo and waiting is not None:
        tell_at = min(p.started for p in todo) + WAITING_AFTER_S
        if tell_at < deadline:
            for t in threads:
                t.join(max(0.0, tell_at - time.monotonic()))
            still = [p for p in todo if not p.collected]
            if still and time.monotonic() < deadline:
                waiting(still)
    for p in here:
        p.collect(deadline)
    for t in threads:
        t.join()  # each kills its command at the deadline
    results = [p.result() for p in pending]
    for p in pending:
        if p.starved is not None:  # our own limit, never "not installed" or a broken daemon
            raise OutOfResources(starved_line(f"start {p.argv[0]}", *p.starved))
    return results


def kill_started_since(started: float) -> None:
    """SIGKILL every command started at or after ``started`` that is still running."""
    for p in list(_LIVE):
        if p.started >= started:
            p.kill()


def run(argv: Sequence[str], timeout_s: float, stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None) -> Completed:
    """Run one command to completion or ``timeout_s``, whichever comes first."""
    return Pending(argv, stdin, env).wait(time.monotonic() + timeout_s)


def child_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """This process's environment plus ``extra`` (for CUDA_MPS_* and friends)."""
    return {**os.environ, **extra}
