"""Test helpers for attacks by an unprivileged user: test users, running as them, Slurm's
job list, and a private mount and PID namespace for runs that could touch host state.

Attacks run as real uids (``useradd`` once per machine, ``setpriv`` or subprocess's
``user=``): root-only shortcuts would prove nothing about what a user can do.
"""

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import pytest

ATTACKER = "mpshevil"  # a local user with no business with MPS
VICTIM = "mpshvictim"  # a user whose job runs on the node


def ensure_user(name: str) -> pwd.struct_passwd:
    """The local user ``name`` (slurmcluster's one way to create test users)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create an unprivileged test user")
    from slurmcluster import ensure_user as create

    return create(name)


def as_user(name: str) -> dict:
    """subprocess keyword arguments that run a command as ``name`` (no extra groups)."""
    pw = ensure_user(name)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def setpriv(name: str) -> List[str]:
    """An argv prefix that drops to ``name`` (for commands inside a namespace)."""
    pw = ensure_user(name)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]


def run_as(name: str, argv: Sequence[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          **as_user(name), **kw)


def squeue_line(job: str, user: str, uid: Optional[int] = None, state: str = "RUNNING",
                gres: str = "gres:mps:50", elapsed: str = "1:00:00") -> str:
    """One line as ``squeue -h -o '%A|%u|%U|%T|%M|%b'`` prints it (Slurm 22.05); by
    default a job running for an hour, past any set-up grace."""
    uid = pwd.getpwnam(user).pw_uid if uid is None else uid
    return f"{job}|{user}|{uid}|{state}|{elapsed}|{gres}"


def fake_squeue(directory: Path, lines: Iterable[str]) -> str:
    """A squeue stand-in printing ``lines`` (made by squeue_line): Slurm's jobs here."""
    listing = directory / "squeue.out"
    listing.write_text("".join(line + "\n" for line in lines))
    script = directory / "squeue"
    script.write_text(f"#!/bin/sh\nexec cat {listing}\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """The root of a site (tests/helpers/nodesite.py) for tests that build its files themselves,
    without the fakes on PATH: root-owned, 0755 (pytest's tmp_path is 0700 to other
    users); make sticky 1777 dirs inside it to stand in for /tmp. Closed afterwards."""
    from nodesite import Site

    site = Site.create(prefix="mpsh-attack-")
    yield site.root
    site.close()


def exec_done(pid: int, timeout: float = 30.0) -> None:
    """Return once the exec of ``pid`` (a Popen that has returned) has finished: its
    command line is in /proc. Popen returns once the exec is past its point of no return
    (the close-on-exec pipe closed), before the kernel lays out the new program's
    arguments and environment: in between, /proc shows an empty command line, and a
    loaded machine can keep the child there for a while."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read(1):
                    return
        except OSError:
            return  # gone: nothing left to wait for
        assert time.monotonic() < deadline, f"{pid} did not finish its exec in {timeout:g}s"
        time.sleep(0.005)


def in_namespace(argv: Sequence[str]) -> List[str]:
    """``argv`` in a private mount and PID namespace (its own /proc; PID 1 is its first
    process, so killing it ends everything it started)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private namespace")
    return ["unshare", "--mount", "--pid", "--fork", "--mount-proc", *argv]


_BUILT: Dict[str, Path] = {}  # the one build of each, this session


def c_fake(name: str) -> Path:
    """tests/fakes/NAME.c built once per session into a world-readable tmp dir (so the
    test users can run it); skips without a C compiler."""
    if name in _BUILT:
        return _BUILT[name]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler (cc) to build tests/fakes/{name}.c")
    import atexit
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=f"mpsh-{name}-"))
    atexit.register(shutil.rmtree, out, True)
    subprocess.run([cc, "-O1", "-o", str(out / name),
                    str(Path(__file__).resolve().parent.parent / "fakes" / f"{name}.c")],
                   check=True, capture_output=True, text=True, timeout=120)
    out.chmod(0o755)
    _BUILT[name] = out / name
    return out / name


class Held:
    """``argv`` run as ``user`` with exactly ``env``, held at its exec under ptrace by
    tests/fakes/held.c (none of its code runs): ``pid`` is the held process, ``holder``
    its tracer. Both are killed at exit, whatever happened."""

    def __init__(self, user: str, argv: Sequence[str], env: Optional[dict] = None) -> None:
        self.user, self.argv, self.env = user, list(argv), dict(env or {})
        self.holder: Optional[subprocess.Popen] = None
        self.pid = 0

    def __enter__(self) -> "Held":
        self.holder = subprocess.Popen([str(c_fake("held")), *self.argv], env=self.env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       **as_user(self.user))
        try:
            assert self.holder.stdout is not None
            line = self.holder.stdout.readline()  # printed once the child is held
            if not line.strip().isdigit():
                raise RuntimeError(f"held did not hold {self.argv[0]}: "
                                   f"{line!r} {self.holder.stderr.read() if self.holder.stderr else ''}")
            self.pid = int(line)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.holder is None:
            return
        if self.pid:
            try:  # the tracer's death kills it too (PTRACE_O_EXITKILL): by its pid anyway
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.holder.kill()
        self.holder.wait(timeout=10)
        for stream in (self.holder.stdout, self.holder.stderr):
            if stream is not None:
                stream.close()
        self.holder = None
