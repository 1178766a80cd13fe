"""Whether a file the kernel would be asked to execute can run on this machine at all.

A binary built for another machine, a file that is no program, or a script whose
interpreter (or an ELF whose loader) is missing fails in ``execve`` with ENOEXEC or
ENOENT. Run through ``setpriv`` (``hostio.runner``), the first two are worse than a
failure: its ``execvp`` hands a file that fails with ENOEXEC to ``/bin/sh``, which runs
it as a shell script. So the runner asks here first and reports the reason instead.
Only ELF and ``#!`` files are programs here (binfmt_misc emulators are not counted).
"""

from __future__ import annotations

import errno
import os
import struct
import sys
from typing import Optional, Tuple

HEAD_BYTES = 4096  # the ELF header and its program headers, or a #! line
PT_INTERP = 3
# Said on stderr, with exit status 127, by a dynamic linker that cannot load a library
# the program needs; and (126 or 127) by setpriv when its own exec of the program fails.
LIBRARY_MISSING = "error while loading shared libraries"
SETPRIV_FAILED = "setpriv: failed to execute "


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES)


def _our_machine() -> bytes:
    """(class, byte order, machine) of the ELF this Python runs as."""
    try:
        head = _head("/proc/self/exe")
    except OSError:
        head = _head(sys.executable) if sys.executable else b""
    return head[4:6] + head[18:20]


def _loader(head: bytes) -> Optional[str]:
    """The ELF's PT_INTERP (its dynamic linker), when its program headers are in ``head``."""
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    try:
        if wide:
            (phoff,) = struct.unpack_from(order + "Q", head, 32)
            size, count = struct.unpack_from(order + "HH", head, 54)
        else:
            (phoff,) = struct.unpack_from(order + "I", head, 28)
            size, count = struct.unpack_from(order + "HH", head, 42)
        for at in range(phoff, phoff + size * count, size):
            (kind,) = struct.unpack_from(order + "I", head, at)
            if kind == PT_INTERP:
                # p_offset and p_filesz, p_vaddr and p_paddr between them
                offset, length = struct.unpack_from(order + ("Q16xQ" if wide else "I8xI"),
                                                    head, at + (8 if wide else 4))
                name = head[offset:offset + length].split(b"\0")[0]
                return name.decode("utf-8", "replace") if name else None
    except struct.error:
        return None  # beyond what was read: the kernel will say
    return None


def why_not_runnable(path: str) -> Optional[Tuple[int, str]]:
    """(errno, reason) when ``path``, an existing executable file, cannot run here; None
    when it can, as far as its first bytes tell."""
    try:
        head = _head(path)
    except OSError:
        return None  # the exec itself will say why
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n")[0].split()
        interpreter = line[0].decode("utf-8", "replace") if line else ""
        if interpreter.startswith("/") and not os.path.isfile(interpreter):
            return errno.ENOENT, f"its interpreter {interpreter} is missing"
        return None
    if not head.startswith(b"\x7fELF") or len(head) < 20:
        return errno.ENOEXEC, "not a program for this machine (neither ELF nor a #! script)"
    if head[4:6] + head[18:20] != _our_machine():
        (machine,) = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)
        return errno.ENOEXEC, (f"built for another architecture (ELF machine {machine}, "
                               f"this node is {os.uname().machine})")
    loader = _loader(head)
    if loader is not None and not os.path.exists(loader):
        return errno.ENOENT, f"its loader {loader} is missing"
    return None


def start_failure(rc: Optional[int], stderr: str) -> Optional[str]:
    """Why the program never started (a library missing, or the exec itself failing), from
    a command that exited 126 or 127; None for the program's own failure."""
    if rc not in (126, 127):
        return None
    for line in stderr.splitlines():
        if LIBRARY_MISSING in line:  # "PATH: error while ...": the path is said already
            return line[line.index(LIBRARY_MISSING):].strip()
        if line.startswith(SETPRIV_FAILED):
            return f"exec failed: {line.rsplit(': ', 1)[-1].strip()}"
    return None
