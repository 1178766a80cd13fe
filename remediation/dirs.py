"""Putting a pipe or log dir right: move aside what is not ours, clear stale entries,
create with the configured mode and owner. Decided twice: once from the facts for
the plan, and again when acting, by ``mps_health.hostio.safedirs`` (no link followed, a fresh
dir swapped into place, what was there moved aside to a random name).
"""

import os
from typing import FrozenSet, List, NamedTuple, Optional, Tuple

from mps_health.checks.directories import repair_of
from mps_health.hostio import safedirs
from mps_health.model.facts import DirFact

# What a daemon leaves in its pipe dir (a clean quit leaves control, control_lock and
# control_privileged; a SIGKILL all five); nothing else is removed.
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


def _what(d: DirFact) -> str:
    return {"symlink": f"a symlink to {d.link_target}", "missing": "missing",
            "dir": f"a dir owned by uid {d.uid}"}.get(d.kind, f"a {d.kind}")


def describe(d: DirFact, target: DirTarget, user_name: str) -> List[str]:
    """The plan's lines for this dir, one per action, in the order they are done."""
    if d.kind == "error":
        return [f"inspect {d.path} again when acting (lstat failed now: {d.error})"]
    why = "not a real directory" if d.kind != "dir" else "owned by someone else"
    said = {"move-aside": f"move {target.path} ({_what(d)}: {why}) aside to "
                          f"{target.path}.aside-<time>-<random>, never following it",
            "create": f"create {target.path} mode {target.mode:04o} owner {user_name}",
            "clear": f"remove stale daemon entries in {target.path} "
                     f"({', '.join(STALE_ENTRIES)}) once no daemon of it is left",
            "chown": f"change owner of {target.path} from uid {d.uid} to {user_name}",
            "chmod": f"change mode of {target.path} from {d.mode:04o} to {target.mode:04o}"}
    return [said[act] for act in actions(d.kind, d.mode, d.uid, target)]


class DirFix(NamedTuple):
    """The plan for one dir of ``remediate dirs`` (and of a reset that needs no restart)."""

    role: str  # "pipe" | "log"
    target: DirTarget  # never ``clear``: the daemon's entries are its own
    lines: Tuple[str, ...]  # what will be done; () when the dir is right
    refused: str = ""  # why it is left to a reset ("" when it can be done here)
    replace: bool = False  # may move what is there aside (no daemon or server uses it)


def plan_fix(role: str, d: DirFact, target: DirTarget, owner_name: str, busy: str,
             instance: str) -> DirFix:
    """What ``remediate dirs`` does to one dir (pure). While ``busy`` (the daemon and
    servers using the instance) run, only what ``directories.repair_of`` leaves to
    ``dirs`` is done; a swap from under them is refused, naming the reset that fixes it.
    With none running, the dir is made or moved aside as a reset would."""
    target = target._replace(clear=False)
    if d.kind == "error":
        return DirFix(role, target, (), f"cannot lstat {d.path}: {d.error}; run it as root")
    acts = actions(d.kind, d.mode, d.uid, target)
    if not acts:
        return DirFix(role, target, ())
    lines = tuple(describe(d, target, owner_name))
    if repair_of(role, d.kind, d.uid in target.trusted) == "dirs":
        return DirFix(role, target, lines)
    if not busy:
        return DirFix(role, target, lines, replace=True)
    why = ("its daemon's sockets are gone or in another's hands" if role == "pipe" else
           "its daemon keeps writing the logs it opened through it until it restarts")
    return DirFix(role, target, lines, f"{role} dir {d.path} is {_what(d)} while {busy} "
                  f"uses it: {why}; run 'mps-health remediate reset {instance}'")


def repair(root: str, target: DirTarget, replace: bool = True) -> List[str]:
    """Act on the dir as it is now (``unit prepare``, ``remediate dirs`` and ``reset``);
    what was done, one line each. Without ``replace`` only a trusted owner's dir is
    repaired (through its fd) or a missing one made: else UnsafePath, nothing touched."""
    parent, name = safedirs.split(target.path)
    pfd = safedirs.open_dir(parent, root)
    try:
        uid, gid = 0, 0  # dir_owner 'any': a trusted dir keeps its owner, a new one is root's
        if target.uid is not None and target.gid is not None:
            uid, gid = target.uid, target.gid
        elif (seen := safedirs.look(pfd, name)).kind == "dir" and seen.uid in target.trusted:
            uid, gid = seen.uid, seen.gid
        try:
            made = safedirs.ensure_dir(pfd, name, target.mode, uid, gid,
                                       lambda e: e.uid in target.trusted, replace)
        except safedirs.UnsafePath as e:
            if replace:
                raise
            raise safedirs.UnsafePath(e.errno, f"{parent.rstrip('/')}/{e}") from None
    finally:
        os.close(pfd)
    done: List[str] = []
    try:
        if made.aside is not None:
            new, was = made.aside
            done.append(f"moved {target.path} ({was.kind}, uid {was.uid}) aside to "
                        f"{parent.rstrip('/')}/{new}")
        if made.created:
            done.append(f"created {target.path} mode {target.mode:04o} owner {uid}:{gid}")
            return done
        if target.clear:
            removed, left = safedirs.remove_entries(made.fd, STALE_ENTRIES)
            if removed:
                done.append(f"removed stale {', '.join(removed)} from {target.path}")
            if left:
                done.append(f"left in {target.path}: {', '.join(left)}")
        if made.changed:
            done.append(f"{target.path}: {'; '.join(made.changed)}")
        return done or [f"{target.path} was already right"]
    finally:
        os.close(made.fd)
