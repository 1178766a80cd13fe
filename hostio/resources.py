"""Our own process running out of file descriptors or memory is never a fact about the node.

EMFILE, ENFILE, ENOMEM (or, for a spawn, EAGAIN) say this process (an exporter under a
connection flood, a low ``ulimit -n``) has nothing left, not that a file is unreadable or
a client missing. Such a failure raises ``OutOfResources``, on purpose no OSError (the
many ``except OSError`` cannot swallow it); the engine makes it one UNKNOWN line for the
sources it hit: never a CRITICAL, never a drain.
"""

from __future__ import annotations

import contextlib
import errno
import resource

STARVED = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN)  # EAGAIN: fork/spawn
HINTS = {  # what to do about each (ENOMEM: the default)
    errno.EMFILE: "raise its LimitNOFILE or ulimit -n",
    errno.ENFILE: "the system's file table is full (fs.file-max)",
    errno.EAGAIN: "no process can be started now (RLIMIT_NPROC, pids cgroup or kernel.pid_max)",
}


class OutOfResources(Exception):
    """This process could not get a file descriptor or memory from the kernel."""


def raise_if_starved(e: OSError, doing: str) -> None:
    """OutOfResources if ``e`` is one of STARVED; else nothing (the caller re-raises ``e``)."""
    if e.errno in STARVED:
        raise OutOfResources(starved_line(doing, e.errno, e.strerror or "")) from None


def starved_line(doing: str, code: int, text: str) -> str:
    """One line: what could not be done, why, and that it is this process's limit."""
    hint = HINTS.get(code, "the node is out of memory")
    if code == errno.EMFILE:
        with contextlib.suppress(OSError):  # resource is loaded: out of fds, no import
            hint = f"it may open {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} files; {hint}"
    return (f"cannot {doing}: {text} (this mps-health process's own limit, not the node's "
            f"MPS: {hint})")
