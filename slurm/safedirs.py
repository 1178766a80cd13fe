"""Per-job dirs in a shared parent (/tmp), made and removed without following a symlink.

Every step works on directory file descriptors: the parent is reached by a walk from
``/`` that opens each component with O_NOFOLLOW and refuses a component another user
could swap (not root's, or writable by others without the sticky bit); the job's dir is
created with ``mkdir`` in that parent, opened again with O_NOFOLLOW, checked to be the
one we made, and only then handed to the job's user with ``fchown``/``fchmod`` on the
fd. An entry planted at the job's name (a symlink, a file, another user's dir) is
renamed aside, never used and never followed. Removal empties the tree through fds,
unlinking symlinks as entries.
"""

import os
import stat
import time
from typing import Iterable, List, Optional, Tuple

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 16  # the daemon makes a flat dir; anything deeper is not ours to walk


class UnsafePath(Exception):
    """A path we must not use, with the one line saying why."""


def _check_component(st: os.stat_result, path: str) -> None:
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafePath(f"{path} is owned by uid {st.st_uid}: another user could replace "
                         "what is inside it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{path} is writable by others without the sticky bit "
                         f"(mode {stat.S_IMODE(st.st_mode):04o})")


def open_dir(path: str) -> int:
    """An fd of the directory ``path``, reached without following any symlink."""
    if not path.startswith("/"):
        raise UnsafePath(f"{path}: not an absolute path")
    fd = os.open("/", DIR_FLAGS)
    walked = ""
    try:
        for part in [p for p in path.split("/") if p]:
            walked += "/" + part
            if part in (".", ".."):
                raise UnsafePath(f"{path}: '.' and '..' are not allowed")
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if os.path.islink(walked):
                    raise UnsafePath(f"{walked} is a symlink: refusing to follow it") from None
                raise UnsafePath(f"{walked}: {e.strerror}") from None
            os.close(fd)
            fd = child
            _check_component(os.fstat(fd), walked)
        return fd
    except BaseException:
        os.close(fd)
        raise


def lstat_at(parent_fd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def kind(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file" if stat.S_ISREG(mode) else "special file"


def move_aside(parent_fd: int, name: str) -> str:
    """Rename the entry ``name`` (never following it) to a name no job uses; the new name."""
    aside = f"{name}.moved-{int(time.time())}-{os.getpid()}"
    os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    return aside


def make_job_dir(parent: str, name: str, uid: int, gid: int, mode: int,
                 notes: List[str]) -> str:
    """Create ``parent/name`` for ``uid``:``gid`` with ``mode``; "created" or "reused".

    An existing real dir of that user (or root's, from an earlier prolog of this job)
    is reused. Anything else at that name is moved aside, with a line in ``notes``.
    """
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePath(f"{name!r} is not a plain directory name")
    parent_fd = open_dir(parent)
    try:
        for _ in range(3):
            st = lstat_at(parent_fd, name)
            if st is not None:
                if stat.S_ISDIR(st.st_mode) and st.st_uid in (uid, 0):
                    if _adopt(parent_fd, name, st, uid, gid, mode):
                        return "reused"
                    continue  # replaced between lstat and open: look again
                aside = move_aside(parent_fd, name)
                notes.append(f"{parent}/{name} was a {kind(st)} owned by uid {st.st_uid}, "
                             f"not this job's: moved aside to {parent}/{aside}")
                continue
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                continue  # someone raced us to the name: judge what is there now
            made = lstat_at(parent_fd, name)
            if made is None or not stat.S_ISDIR(made.st_mode) \
                    or made.st_uid != os.geteuid():
                continue
            if _adopt(parent_fd, name, made, uid, gid, mode):
                return "created"
        raise UnsafePath(f"{parent}/{name}: something keeps replacing it; gave up after "
                         "3 tries")
    finally:
        os.close(parent_fd)


def _adopt(parent_fd: int, name: str, seen: os.stat_result, uid: int, gid: int,
           mode: int) -> bool:
    """Open the dir we judged (same inode, no symlink) and give it to the job's user."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
            return False
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        return True
    finally:
        os.close(fd)


def owned_dir(path: str, uid: int) -> bool:
    """Is ``path`` a real dir (not a symlink, parent reached without one) owned by ``uid``?"""
    parent, name = os.path.split(path)
    try:
        parent_fd = open_dir(parent)
    except UnsafePath:
        return False
    try:
        st = lstat_at(parent_fd, name)
    finally:
        os.close(parent_fd)
    return st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def list_names(parent: str) -> Tuple[str, ...]:
    """The entries of ``parent`` (reached without a symlink); () when it cannot be read."""
    try:
        fd = open_dir(parent)
    except UnsafePath:
        return ()
    try:
        return tuple(sorted(os.listdir(fd)))
    finally:
        os.close(fd)


def remove_job_dir(path: str, owners: Iterable[int]) -> Optional[str]:
    """Remove ``path`` and everything in it, following no symlink; None, or what went wrong.

    Only an entry owned by one of ``owners`` (the job's user, root) is removed: a dir
    that another user planted there after the job started is left for the admin.
    """
    parent, name = os.path.split(path)
    try:
        parent_fd = open_dir(parent)
    except UnsafePath as e:
        return str(e)
    try:
        st = lstat_at(parent_fd, name)
        if st is None:
            return None
        if st.st_uid not in set(owners):
            return f"{path} is owned by uid {st.st_uid}, not this job's user: left alone"
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)  # a symlink goes, its target is untouched
            return None
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError as e:
            return f"cannot open {path}: {e.strerror}"
        try:
            problems = _empty(fd, path, 0)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError as e:
            problems.append(f"cannot remove {path}: {e.strerror}")
        return "; ".join(problems) or None
    finally:
        os.close(parent_fd)


def _empty(fd: int, shown: str, depth: int) -> List[str]:
    problems: List[str] = []
    for entry in os.scandir(fd):
        where = f"{shown}/{entry.name}"
        try:
            if entry.is_dir(follow_symlinks=False):
                if depth >= MAX_DEPTH:
                    problems.append(f"{where}: nested more than {MAX_DEPTH} deep, left")
                    continue
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                try:
                    problems += _empty(sub, where, depth + 1)
                finally:
                    os.close(sub)
                os.rmdir(entry.name, dir_fd=fd)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"cannot remove {where}: {e.strerror}")
    return problems
