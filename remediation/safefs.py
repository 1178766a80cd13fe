"""Directory repairs that never follow a symlink planted by someone else.

Every operation works on directory file descriptors: the parent of a pipe or log dir
is opened one component at a time with O_NOFOLLOW, and the dir itself is only ever
renamed, created, listed, chown-ed and chmod-ed through a descriptor or relative to
its parent's descriptor. A path cannot be swapped for a symlink between our look and
our act, because there is no second lookup by path. A symlink among the *parents* is
followed only when root owns it and nobody else can replace it (``/var/run -> /run``),
as systemd's CHASE_SAFE does.
"""

import contextlib
import errno
import os
import stat
import time
from typing import Iterable, List, NamedTuple, Optional, Tuple

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 8


class UnsafePath(OSError):
    """A path we refuse to go through; the message is the one line the user sees."""


class Entry(NamedTuple):
    """What a name in a directory is, by lstat relative to the directory's fd."""

    kind: str  # "missing" | "dir" | "symlink" | "file" | "socket" | "fifo" | "other"
    mode: int = 0
    uid: int = -1
    gid: int = -1


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"), (stat.S_ISREG, "file"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISFIFO, "fifo")):
        if test(mode):
            return name
    return "other"


def _trusted_link(link: os.stat_result, parent: os.stat_result) -> bool:
    """A symlink that only root could have made and only root can replace."""
    if link.st_uid != 0:
        return False
    others_write = parent.st_mode & 0o022
    return not others_write or bool(parent.st_mode & stat.S_ISVTX)


def open_dir(root: str, path: str) -> int:
    """An fd on directory ``path`` (absolute, as configured) under ``root``; UnsafePath if a
    component is an untrusted symlink or not a directory. The caller closes the fd."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    fd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = ""
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                raise UnsafePath(errno.EINVAL, f"{path}: '..' in a path is not accepted")
            try:
                nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(e.errno, f"{walked}/{name}: {e.strerror}") from None
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise UnsafePath(errno.ENOTDIR, f"{walked}/{name}: not a directory") from None
                if not _trusted_link(st, os.fstat(fd)):
                    raise UnsafePath(errno.ELOOP, f"{walked}/{name}: a symlink owned by uid "
                                     f"{st.st_uid} in a directory others can write; "
                                     "refusing to follow it") from None
                links += 1
                if links > MAX_LINKS:
                    raise UnsafePath(errno.ELOOP, f"{path}: too many symlinks") from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):  # absolute: start again from the root
                    os.close(fd)
                    fd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            os.close(fd)
            fd = nfd
            walked += "/" + name
        return fd
    except BaseException:
        os.close(fd)
        raise


def look(parent_fd: int, name: str) -> Entry:
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Entry("missing")
    return Entry(kind_of(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)


def aside_name(name: str) -> str:
    import secrets

    return f"{name}.aside-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


def move_aside(parent_fd: int, name: str) -> str:
    """Rename ``name`` to a fresh name beside it (a rename never follows the entry)."""
    for _ in range(5):
        new = aside_name(name)
        if look(parent_fd, new).kind == "missing":
            os.rename(name, new, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            return new
    raise OSError(errno.EEXIST, f"no free name to move {name} aside")


def open_child_dir(parent_fd: int, name: str) -> int:
    return os.open(name, DIR_FLAGS, dir_fd=parent_fd)


def make_dir(parent_fd: int, name: str, mode: int, uid: int, gid: int) -> int:
    """Create ``name`` and give it ``mode`` and owner through its fd (umask-proof).

    The dir is created 0700 and opened without following links before it is opened up,
    so nobody can use it (or swap it) before it has its final owner and mode."""
    os.mkdir(name, 0o700, dir_fd=parent_fd)
    fd = open_child_dir(parent_fd, name)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafePath(errno.EEXIST, f"{name}: replaced by someone else while created")
        set_owner_mode(fd, mode, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def set_owner_mode(fd: int, mode: int, uid: int, gid: int) -> List[str]:
    """chown then chmod through the fd (chown may clear set-id bits, so chmod comes last)."""
    done: List[str] = []
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
        done.append(f"owner {st.st_uid}:{st.st_gid} -> {uid}:{gid}")
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
        old = stat.S_IMODE(st.st_mode)
        os.fchmod(fd, mode)
        done.append(f"mode {old:04o} -> {mode:04o}")
    return done


def remove_entries(dir_fd: int, names: Iterable[str]) -> Tuple[List[str], List[str]]:
    """Unlink these names in the dir (unlink never follows a symlink); (removed, left)."""
    removed: List[str] = []
    left: List[str] = []
    for name in names:
        try:
            os.unlink(name, dir_fd=dir_fd)
            removed.append(name)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            left.append(f"{name} (a directory)")
        except OSError as e:
            left.append(f"{name} ({e.strerror})")
    return removed, left


def remove_tree(parent_fd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` and all it holds; a symlink anywhere is unlinked, never entered."""
    if depth > 32:
        raise OSError(errno.ELOOP, f"{name}: nested too deep to remove")
    entry = look(parent_fd, name)
    if entry.kind == "missing":
        return
    if entry.kind != "dir":
        os.unlink(name, dir_fd=parent_fd)
        return
    fd = open_child_dir(parent_fd, name)
    try:
        for child in list_names(fd):
            remove_tree(fd, child, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def list_names(dir_fd: int) -> List[str]:
    dup = os.dup(dir_fd)  # scandir(fd) closes nothing, but rewinds: use a copy
    try:
        with os.scandir(dup) as it:
            return sorted(e.name for e in it)
    finally:
        os.close(dup)


def split(path: str) -> Tuple[str, str]:
    """("/parent", "name") of an absolute path."""
    parent, name = os.path.split(path.rstrip("/"))
    if not name:
        raise UnsafePath(errno.EINVAL, f"{path}: not a path to a directory entry")
    return parent or "/", name


def write_atomic(root: str, path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a file through a temp name in the same dir, fsync, then rename over ``path``."""
    parent, name = split(path)
    pfd = open_dir(root, parent)
    tmp = f".{name}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        os.fsync(pfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=pfd)
        raise
    finally:
        os.close(pfd)


def read_small(root: str, path: str, limit: int = 1 << 20) -> Optional[bytes]:
    """A file's content without following a final symlink; None if it does not exist."""
    parent, name = split(path)
    try:
        pfd = open_dir(root, parent)
    except UnsafePath as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    except FileNotFoundError:
        return None
    finally:
        os.close(pfd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
