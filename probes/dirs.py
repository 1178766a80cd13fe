"""Pipe and log directories, by lstat: a symlink is reported, never followed."""

from __future__ import annotations

import os
import stat
from typing import Dict, List, Optional, Tuple

from mps_health.hostio.pidfile import PID_FILE, read_text
from mps_health.hostio.resources import raise_if_starved
from mps_health.hostio.safedirs import kind_of
from mps_health.model.facts import DirFact, EntryFact, Instance, ParentFact
from mps_health.probes.context import Context


def read_dir(path: str, shown_as: str, with_entries: bool) -> DirFact:
    """lstat ``path`` (under --root), shown as configured (``shown_as``)."""
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
    entries, pid_file = _read_entries(path) if kind == "dir" and with_entries else ((), None)
    return DirFact(shown_as, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                   owner_name(st.st_uid), target, None, entries, pid_file)


def _read_entries(path: str) -> Tuple[Tuple[EntryFact, ...], Optional[str]]:
    found: List[EntryFact] = []
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
    pid_file = read_text(path) if any(e.name == PID_FILE and e.kind == "file" for e in found) \
        else None
    return tuple(sorted(found)), pid_file


# Path components walked above a dir at most: a configured path is short, and the walk
# must stay bounded whatever it is.
MAX_PARENTS = 64


def blocked_parents(ctx: Context, path: str) -> Tuple[ParentFact, ...]:
    """The parents of ``path`` (not "/" nor a --root tree's own) with no execute bit for
    others: a 0700 /run/nvidia above a 0777 pipe dir fails every non-root client while
    the pipe dir looks right. By lstat, from the top, up to one that cannot be looked at."""
    found: List[ParentFact] = []
    parts = [p for p in path.split("/") if p not in ("", ".")][:-1][:MAX_PARENTS]
    walked = ""
    for name in parts:
        walked += "/" + name
        try:
            st = os.lstat(ctx.path(walked))
            if stat.S_ISLNK(st.st_mode) and st.st_uid == 0 and not ctx.read_only:
                # Root's link (/var/run -> /run): clients go through it, so what it leads
                # to is judged (a stat, nothing done there). A user's link, or any link
                # in a --root tree, is not followed: it names nothing of this node's.
                st = os.stat(ctx.path(walked))
        except OSError:
            break
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            found.append(ParentFact(walked, stat.S_IMODE(st.st_mode), st.st_uid))
    return tuple(found)


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> Dict[str, DirFact]:
    """Every instance's pipe dir (with its entries) and log dir, keyed by path."""
    out: Dict[str, DirFact] = {}
    for inst in instances:
        for path, entries in ((inst.pipe_dir, True), (inst.log_dir, False)):
            if path not in out:
                d = read_dir(ctx.path(path), path, entries)
                # An lstat refused ("error") may be a blocked parent's doing: look there too.
                out[path] = d._replace(blocked=blocked_parents(ctx, path)) \
                    if d.kind in ("dir", "error") else d
    return out


VALUE_TYPE = Dict[str, DirFact]


def owner_name(uid: int) -> Optional[str]:
    """The user name of ``uid`` (hostio.users loaded lazily: not on the plain check's path)."""
    from mps_health.hostio.users import name_of

    return name_of(uid)
