"""Pipe and log directories, by lstat: a symlink is reported, never followed."""

from __future__ import annotations

import os
import stat

from ..context import Context
from ..facts import DirFact, EntryFact, Instance
from ..pidfile import PID_FILE, read_text
from ..resources import raise_if_starved

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple


def kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "fifo"
    return "other"


def read_dir(path: str, shown_as: str, with_entries: bool) -> DirFact:
    """lstat ``path`` (the real path under --root); ``shown_as`` is the configured path."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return DirFact(shown_as, "missing")
    except OSError as e:
        return DirFact(shown_as, "error", error=e.strerror)
    kind = kind_of(st.st_mode)
    target = None
    if kind == "symlink":
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
    entries: Tuple[EntryFact, ...] = ()
    pid_file = None
    if kind == "dir" and with_entries:
        entries, pid_file = _read_entries(path)
    return DirFact(shown_as, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                   _name_of(st.st_uid), target, None, entries, pid_file)


def _read_entries(path: str) -> Tuple[Tuple[EntryFact, ...], Optional[str]]:
    found: List[EntryFact] = []
    pid_file = None
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append(EntryFact(entry.name, kind_of(st.st_mode),
                                       stat.S_IMODE(st.st_mode), st.st_uid))
    except OSError as e:  # out of fds: our trouble, not an empty pipe dir
        raise_if_starved(e, f"list {path}")
        return (), None
    if any(e.name == PID_FILE and e.kind == "file" for e in found):
        pid_file = read_text(path)
    found.sort()
    return tuple(found), pid_file


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> Dict[str, DirFact]:
    """Every instance's pipe dir (with its entries) and log dir, keyed by path."""
    out: Dict[str, DirFact] = {}
    for inst in instances:
        if inst.pipe_dir not in out:
            out[inst.pipe_dir] = read_dir(ctx.path(inst.pipe_dir), inst.pipe_dir, True)
        if inst.log_dir not in out:
            out[inst.log_dir] = read_dir(ctx.path(inst.log_dir), inst.log_dir, False)
    return out


VALUE_TYPE = "Dict[str, DirFact]"  # read by codec, in this module's names


def _name_of(uid: int) -> Optional[str]:
    from ..users import name_of  # lazy: no NamedTuple built on the plain check's path

    return name_of(uid)
