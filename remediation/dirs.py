"""Putting a pipe or log dir right: move aside what is not ours, clear stale entries,
create with the configured mode and owner. Decided twice: once from the facts for
the plan, and again from a fresh lstat through the parent's fd when acting.
"""

import errno
import os
from typing import FrozenSet, List, NamedTuple, Optional, Tuple

from . import safefs

# What a daemon leaves in its pipe dir (seen on a real daemon: after a clean quit
# control, control_lock and control_privileged remain; after a SIGKILL all five); nothing
# else is removed.
STALE_ENTRIES = ("control", "control_privileged", "control_lock", "log",
                 "nvidia-cuda-mps-control.pid")


class DirTarget(NamedTuple):
    path: str  # as configured (without --root)
    mode: int
    uid: Optional[int]  # None: keep the current owner (dir_owner 'any')
    gid: Optional[int]
    trusted: FrozenSet[int]  # owners whose dir we repair in place; others' is moved aside
    clear: bool  # remove stale daemon entries (pipe dirs)


def actions(kind: str, mode: int, uid: int, target: DirTarget) -> Tuple[str, ...]:
    """What to do with a dir found as (kind, mode, uid): a pure decision."""
    if kind == "missing":
        return ("create",)
    if kind != "dir" or uid not in target.trusted:
        return ("move-aside", "create")
    out: List[str] = []
    if target.clear:
        out.append("clear")
    if target.uid is not None and uid != target.uid:
        out.append("chown")
    if mode != target.mode:
        out.append("chmod")
    return tuple(out)


def describe(kind: str, mode: int, uid: int, link: Optional[str], target: DirTarget,
             user_name: str) -> List[str]:
    """The plan's lines for this dir."""
    lines: List[str] = []
    acts = actions(kind, mode, uid, target)
    what = {"symlink": f"a symlink to {link}", "dir": f"a dir owned by uid {uid}"}.get(
        kind, f"a {kind}")
    if "move-aside" in acts:
        why = "not a real directory" if kind != "dir" else "owned by someone else"
        lines.append(f"move {target.path} ({what}: {why}) aside to "
                     f"{target.path}.aside-<time>-<random>, never following it")
    if "create" in acts:
        lines.append(f"create {target.path} mode {target.mode:04o} owner {user_name}")
    if "clear" in acts:
        lines.append(f"remove stale daemon entries in {target.path} ({', '.join(STALE_ENTRIES)}) "
                     "once no daemon of it is left")
    if "chown" in acts:
        lines.append(f"change owner of {target.path} from uid {uid} to {user_name}")
    if "chmod" in acts:
        lines.append(f"change mode of {target.path} from {mode:04o} to {target.mode:04o}")
    return lines


def repair(root: str, target: DirTarget) -> List[str]:
    """Act on the dir as it is now; returns what was done, one line each."""
    parent, name = safefs.split(target.path)
    pfd = safefs.open_dir(root, parent)
    try:
        return _repair_in(pfd, parent, name, target)
    finally:
        os.close(pfd)


def _owner_of_new(target: DirTarget) -> Tuple[int, int]:
    if target.uid is None or target.gid is None:
        return 0, 0
    return target.uid, target.gid


def _repair_in(pfd: int, parent: str, name: str, target: DirTarget) -> List[str]:
    done: List[str] = []
    for _ in range(3):  # a dir swapped under us between look and open: decide again
        entry = safefs.look(pfd, name)
        acts = actions(entry.kind, entry.mode, entry.uid, target)
        if "move-aside" in acts:
            new = safefs.move_aside(pfd, name)
            done.append(f"moved {target.path} ({entry.kind}, uid {entry.uid}) aside to "
                        f"{parent.rstrip('/')}/{new}")
        if "create" in acts:
            uid, gid = _owner_of_new(target)
            try:
                fd = safefs.make_dir(pfd, name, target.mode, uid, gid)
            except FileExistsError:
                continue  # someone made it meanwhile: look again
            os.close(fd)
            done.append(f"created {target.path} mode {target.mode:04o} owner {uid}:{gid}")
            return done
        try:
            fd = safefs.open_child_dir(pfd, name)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue  # became a symlink or vanished since we looked
            raise
        try:
            st = os.fstat(fd)
            if st.st_uid not in target.trusted:
                continue  # changed owner since we looked: move it aside on the next turn
            if target.clear:
                removed, left = safefs.remove_entries(fd, STALE_ENTRIES)
                if removed:
                    done.append(f"removed stale {', '.join(removed)} from {target.path}")
                if left:
                    done.append(f"left in {target.path}: {', '.join(left)}")
            uid = target.uid if target.uid is not None else st.st_uid
            gid = target.gid if target.gid is not None else st.st_gid
            changed = safefs.set_owner_mode(fd, target.mode, uid, gid)
            if changed:
                done.append(f"{target.path}: {'; '.join(changed)}")
        finally:
            os.close(fd)
        if not done:
            done.append(f"{target.path} was already right")
        return done
    raise OSError(errno.EAGAIN, f"{target.path} kept changing while we repaired it; "
                  "someone else is working on it")
