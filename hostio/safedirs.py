"""Directories in places other users can write (/tmp, 0777 pipe dirs): the one library
(``remediate reset``/``orphans``, ``unit prepare``, the Slurm hooks, the atomic writer).

* **Walk, never look up a path twice.** From ``/`` (or ``--root``) one component at a
  time, ``O_NOFOLLOW|O_DIRECTORY``, each step relative to the parent's fd: nothing can be
  swapped between our look and our act.
* **One symlink policy.** A parent symlink is followed only when root owns it and its dir
  is not writable by others (or is sticky), as systemd's CHASE_SAFE (``/var/run ->
  /run``); the entry we act on never is. With ``guard`` (dirs MPS or a job will use)
  every dir walked must also be root's (or ours) and not writable by others without the
  sticky bit, or its owner could swap our dir after we checked it. The atomic writer
  (working within the parent's fd) needs only the link rule: a service account's dir
  (``/var/lib/prometheus``) is fine.
* **Create under a random name, swap into place.** Made 0700, checked through its fd,
  given its owner and mode, then put in place with ``renameat2(RENAME_NOREPLACE)`` or,
  over an unacceptable entry, ``RENAME_EXCHANGE``: a racing user can make us retry,
  never give up, never adopt what they planted.
* **Move aside to random names** (``NAME.aside-<time>-<random>``, ``RENAME_NOREPLACE``):
  never entered, removed or overwritten; the name cannot be pre-empted.
* **Remove, entering no link** (``remove_tree``): each dir is made root's 0700 through
  its fd (its user can add nothing more), then emptied with ``*at`` calls, bounded in
  depth, entries and file system; what cannot go is one line with the command to run.
* **Keep a daemon's files its own** (``keep_files``): the files it opens in its log dir
  are regular files of its user, or are put out of the way before it starts.

Where the file system refuses ``renameat2`` flags (EINVAL) the same steps run with plain
renames after a fresh look: still no link followed, only the race window is wider.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from typing import Callable, Iterable, List, NamedTuple, Optional, Tuple

ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # the root itself may be a link
DIR_FLAGS = ROOT_FLAGS | os.O_NOFOLLOW
MAX_LINKS = 8
MAX_DEPTH = 32  # a daemon's dir is flat: anything deeper is not ours to walk
TRIES = 64  # each retry needs the other user to win a race again; we never lose for good
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


class UnsafePath(OSError):
    """A path we refuse to go through; ``str()`` is the one line the user sees."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class Entry(NamedTuple):
    """What a name in a directory is, by lstat relative to the directory's fd."""

    kind: str  # "missing" | "dir" | "symlink" | "file" | "socket" | "fifo" | "other"
    uid: int = -1
    gid: int = -1
    dev_ino: Tuple[int, int] = (0, 0)


KINDS = {stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFREG: "file",
         stat.S_IFSOCK: "socket", stat.S_IFIFO: "fifo"}


def kind_of(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "other")


def look(parent_fd: int, name: str) -> Entry:
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Entry("missing")
    return Entry(kind_of(st.st_mode), st.st_uid, st.st_gid, (st.st_dev, st.st_ino))


def split(path: str) -> Tuple[str, str]:
    """("/parent", "name") of an absolute path to an entry."""
    parent, name = os.path.split(path.rstrip("/"))
    if not path.startswith("/") or name in ("", ".", ".."):
        raise UnsafePath(errno.EINVAL, f"{path}: not an absolute path to a directory entry")
    return parent or "/", name


# --- the walk ---------------------------------------------------------------------------

def _others_can_swap(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX


def open_dir(path: str, root: str = "/", guard: bool = True) -> int:
    """An fd on directory ``path`` (absolute, as configured) under ``root``, reached by the
    rules above; UnsafePath with one line otherwise. The caller closes the fd."""
    if not path.startswith("/"):
        raise UnsafePath(errno.EINVAL, f"{path}: not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    fd = os.open(root or "/", ROOT_FLAGS)
    walked, links = "", 0
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
                if st.st_uid != 0 or _others_can_swap(os.fstat(fd)):
                    raise UnsafePath(errno.ELOOP, f"{walked}/{name}: a symlink owned by uid "
                                     f"{st.st_uid} or in a directory others can write; "
                                     "refusing to follow it") from None
                links += 1
                if links > MAX_LINKS:
                    raise UnsafePath(errno.ELOOP, f"{path}: too many symlinks") from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):  # absolute: start again from the root
                    os.close(fd)
                    fd = os.open(root or "/", ROOT_FLAGS)
                    walked = ""
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            os.close(fd)
            fd = nfd
            walked += "/" + name
            at = os.fstat(fd) if guard else None
            if at is not None and at.st_uid not in (0, os.geteuid()):
                raise UnsafePath(errno.EPERM, f"{walked} is owned by uid {at.st_uid}: another "
                                 "user could replace what is inside it")
            if at is not None and _others_can_swap(at):
                raise UnsafePath(errno.EPERM, f"{walked} is writable by others without the "
                                 f"sticky bit (mode {stat.S_IMODE(at.st_mode):04o})")
        return fd
    except BaseException:
        os.close(fd)
        raise


# --- renames ------------------------------------------------------------------------------

def rename2(parent_fd: int, old: str, new: str, flags: int) -> None:
    """renameat2 within one dir; NotImplementedError where the kernel, libc or file system
    lacks it (the caller then takes the plain-rename path)."""
    import ctypes  # only here: a swap or move aside, never a healthy run's write

    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is None:
        raise NotImplementedError("renameat2 is not in this libc")
    if func(parent_fd, os.fsencode(old), parent_fd, os.fsencode(new), flags) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        raise NotImplementedError(os.strerror(err))
    raise OSError(err, os.strerror(err), new)


def random_name(name: str, what: str) -> str:
    return f"{name}.{what}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(8).hex()}"


def move_aside(parent_fd: int, name: str, called: Optional[str] = None,
               what: str = "aside") -> str:
    """Rename ``name`` (never following it) to a fresh random name beside it, made from
    ``called`` (default ``name``) and ``what``; returns the new name."""
    for _ in range(TRIES):
        new = random_name(called or name, what)
        try:
            rename2(parent_fd, name, new, RENAME_NOREPLACE)
            return new
        except FileExistsError:
            continue
        except NotImplementedError:
            if look(parent_fd, new).kind == "missing":
                os.rename(name, new, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                return new
    raise OSError(errno.EEXIST, f"no free name to move {name} aside")


# --- making, repairing, removing ------------------------------------------------------------

def set_owner_mode(fd: int, mode: int, uid: int, gid: int) -> List[str]:
    """chown then chmod through the fd (chown may clear set-id bits, so chmod comes last)."""
    done: List[str] = []
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
        done.append(f"owner {st.st_uid}:{st.st_gid} -> {uid}:{gid}")
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
        os.fchmod(fd, mode)
        done.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")
    return done


def _open_as_seen(parent_fd: int, name: str, seen: Entry) -> Optional[int]:
    """An fd on ``name`` if it is still the very dir we judged (same inode, no link)."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != seen.dev_ino:
        os.close(fd)
        return None
    return fd


def _fresh(parent_fd: int, name: str, mode: int, uid: int, gid: int) -> Tuple[int, str]:
    """A new dir under a random name, ours for sure, with its final owner and mode."""
    for _ in range(TRIES):
        tmp = random_name(f".{name}", "new")
        try:
            os.mkdir(tmp, 0o700, dir_fd=parent_fd)  # mkdir is O_EXCL by nature
        except FileExistsError:
            continue
        fd = _open_as_seen(parent_fd, tmp, look(parent_fd, tmp))
        if fd is not None and os.fstat(fd).st_uid == os.geteuid():
            set_owner_mode(fd, mode, uid, gid)
            return fd, tmp
        if fd is not None:
            os.close(fd)  # swapped under us: leave it, take another name
    raise OSError(errno.EEXIST, f"no free name to create {name} under")


class Made(NamedTuple):
    fd: int  # the dir now at the name; the caller closes it
    created: bool  # False: an acceptable dir was already there (reused)
    aside: Optional[Tuple[str, Entry]]  # (new name, what it was) of what was moved away
    changed: Tuple[str, ...] = ()  # owner/mode changes made to a reused dir


def ensure_dir(parent_fd: int, name: str, mode: int, uid: int, gid: int,
               acceptable: Callable[[Entry], bool], replace: bool = True) -> Made:
    """Make ``name`` a real dir with ``mode`` and ``uid``:``gid``. An ``acceptable`` dir is
    kept (owner and mode set through its fd); anything else is swapped out for a fresh
    dir in one step and left beside it under a random name. With ``replace`` False (a
    daemon may run in it) nothing is swapped: only a missing name is made, anything else
    is left as it is (UnsafePath naming it)."""
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePath(errno.EINVAL, f"{name!r} is not a plain directory name")
    for _ in range(TRIES):
        entry = look(parent_fd, name)
        if entry.kind == "dir" and acceptable(entry):
            fd = _open_as_seen(parent_fd, name, entry)
            if fd is None:
                continue  # replaced between look and open: judge again
            return Made(fd, False, None, tuple(set_owner_mode(fd, mode, uid, gid)))
        if not replace and entry.kind != "missing":
            what = f"a {entry.kind}" if entry.kind != "dir" else f"a dir owned by uid {entry.uid}"
            raise UnsafePath(errno.EEXIST, f"{name} is now {what}: left as it is")
        fd, tmp = _fresh(parent_fd, name, mode, uid, gid)
        placed = False
        try:
            try:
                rename2(parent_fd, tmp, name,
                        RENAME_NOREPLACE if entry.kind == "missing" else RENAME_EXCHANGE)
                placed = True
            except (FileExistsError, FileNotFoundError):
                continue  # someone made or removed the name meanwhile: judge again
            except NotImplementedError:
                placed, aside = _plain_swap(parent_fd, tmp, name, entry)
                if not placed:
                    continue
                return Made(fd, True, aside)
            if entry.kind == "missing":
                return Made(fd, True, None)
            was = look(parent_fd, tmp)  # what we swapped out, whatever it became meanwhile
            try:
                return Made(fd, True, (move_aside(parent_fd, tmp, name), was))
            except FileNotFoundError:
                return Made(fd, True, None)  # its owner took it away themselves
        finally:
            if not placed:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.rmdir(tmp, dir_fd=parent_fd)
    raise UnsafePath(errno.EAGAIN, f"{name}: replaced {TRIES} times while we made it")


def _plain_swap(parent_fd: int, tmp: str, name: str, entry: Entry
                ) -> Tuple[bool, Optional[Tuple[str, Entry]]]:
    """Without renameat2: move the entry aside, then rename ours over the empty name (a
    rename onto a non-empty dir or a non-dir fails, so nothing planted is adopted)."""
    aside = None
    if entry.kind != "missing":
        with contextlib.suppress(FileNotFoundError):
            aside = (move_aside(parent_fd, name), entry)
    try:
        os.rename(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False, aside
        raise
    return True, aside


def remove_tree(parent_fd: int, name: str, shown: str, owners: Optional[Iterable[int]] = None
                ) -> List[str]:
    """Remove ``name`` and all it holds, following no link; with ``owners``, only an entry
    one of them owns. Each dir is made root's 0700 through its fd before anything inside
    is touched (its user cannot add, rename or swap anything, even from a shell inside).
    Bounded by ``MAX_DEPTH``, ``MAX_ENTRIES`` and the top dir's file system. Returns []
    or ONE line naming the first problem and a command to run."""
    entry = look(parent_fd, name)
    if entry.kind == "missing":
        return []
    allowed = None if owners is None else sorted(set(owners))
    if allowed is not None and entry.uid not in allowed:
        return [f"{shown} is owned by uid {entry.uid}, not by uid "
                f"{'/'.join(map(str, allowed))}: left alone"]
    if entry.kind != "dir":
        try:
            os.unlink(name, dir_fd=parent_fd)  # a link is unlinked, its target untouched
        except FileNotFoundError:
            pass
        except OSError as e:
            return [f"cannot remove {shown}: {e.strerror or e}"]
        return []
    fd = _open_as_seen(parent_fd, name, entry)
    if fd is None:  # only its owner could swap it, before we made it root's: judge again
        return [f"cannot remove {shown}: it was replaced while we looked; run again"]
    try:
        _seize(fd)
        # Only root can rename it now: the name must still be the dir we hold.
        if look(parent_fd, name).dev_ino != entry.dev_ino:
            return [f"cannot remove {shown}: it was moved away while we removed it (now "
                    "root's and 0700 under another name in the same dir); run again"]
        walk = _Walk(entry.dev_ino[0])
        _empty(fd, walk, 1, "")
        if walk.problem:
            return [_left(shown, walk.problem)]
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        return [_left(shown, e.strerror or str(e))]
    finally:
        os.close(fd)
    return []


MAX_ENTRIES = 100000  # a job's MPS dirs hold a handful; more is a user filling them


class _Walk:
    """One removal's budget and its first problem ("" while there is none). A plain
    class: a dataclass would import dataclasses (and inspect) on every run that writes
    a file."""

    __slots__ = ("count", "dev", "problem")

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self.count = 0
        self.problem = ""


def _left(shown: str, why: str) -> str:
    from mps_health.model.printable import escape

    return (f"cannot remove {shown} whole ({escape(why, 200)}); left root's and 0700, so "
            f"no user can add to it: remove it by hand with "
            f"'rm -rf --one-file-system -- {shown}'")


def _seize(fd: int) -> None:
    """Make the dir root's and 0700 through its fd, so its user can no longer change what
    is in it while we empty it (best effort: an unprivileged run removes what it may)."""
    with contextlib.suppress(OSError):
        if os.geteuid() == 0:
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o700)


def _listing(fd: int, room: float = float("inf")) -> List[Tuple[str, bool]]:
    """(name, is a dir) of at most ``room`` entries of the dir (lstat-like: never follows)."""
    dup = os.dup(fd)  # scandir(fd) rewinds the offset on close: use a copy
    found: List[Tuple[str, bool]] = []
    try:
        with os.scandir(dup) as it:
            for e in it:
                found.append((e.name, e.is_dir(follow_symlinks=False)))
                if len(found) >= room:
                    break
    finally:
        os.close(dup)
    return found


def _empty(fd: int, walk: _Walk, depth: int, where: str) -> None:
    """Remove everything in the dir at ``fd``; stops at the first problem (``walk.problem``)."""
    for child, is_dir in _listing(fd, MAX_ENTRIES - walk.count + 1):
        walk.count += 1
        sub = f"{where}/{child}"
        if walk.count > MAX_ENTRIES:
            walk.problem = f"more than {MAX_ENTRIES} entries"
            return
        try:
            if not is_dir:
                try:
                    os.unlink(child, dir_fd=fd)  # unlink never follows a link
                    continue
                except IsADirectoryError:
                    pass  # a dir now (only root can change a seized dir): walk it below
            if depth >= MAX_DEPTH:
                walk.problem = f"nested more than {MAX_DEPTH} deep at .{sub}"
                return
            cfd = os.open(child, DIR_FLAGS, dir_fd=fd)
            try:
                if os.fstat(cfd).st_dev != walk.dev:
                    walk.problem = f".{sub} is another file system mounted there: unmount it first"
                    return
                _seize(cfd)
                _empty(cfd, walk, depth + 1, sub)
            finally:
                os.close(cfd)
            if walk.problem:
                return
            os.rmdir(child, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            walk.problem = f".{sub}: {e.strerror}"
            return


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


def keep_files(path: str, uids: Iterable[int], names: Iterable[str], root: str = "/"
               ) -> List[str]:
    """Before a daemon that opens ``names`` in its log dir ``path`` starts: each must be
    missing or a regular file of one of ``uids`` with one link, or the daemon would append
    to whatever it leads to (a link to /etc/shadow, a hard link, a blocking FIFO) or go on
    with a forged log. Nothing is followed: a symlink is unlinked (its target untouched),
    anything else renamed to ``.NAME.foreign-<time>-<random>`` for the admin; the dir is
    reached by the guarded walk. One line per entry moved or removed; OSError (or
    UnsafePath) when the dir cannot be reached."""
    wanted = set(uids)
    parent, name = split(path)
    pfd = open_dir(parent, root)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
    finally:
        os.close(pfd)
    done: List[str] = []
    try:
        for file in names:
            try:
                st = os.stat(file, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            kind = kind_of(st.st_mode)
            if kind == "file" and st.st_uid in wanted and st.st_nlink == 1:
                continue
            what = f"a {kind} owned by uid {st.st_uid}" + (
                f" with {st.st_nlink} links" if kind == "file" and st.st_nlink > 1 else "")
            try:
                if kind == "symlink":
                    os.unlink(file, dir_fd=fd)
                    how = "removed the link (its target untouched)"
                else:
                    how = f"moved aside to {path}/{move_aside(fd, file, f'.{file}', 'foreign')}"
            except FileNotFoundError:
                continue  # gone meanwhile: the daemon makes its own
            done.append(f"{path}/{file} was {what}, not the daemon's log: {how}")
        return done
    finally:
        os.close(fd)


def list_names(dir_fd: int) -> List[str]:
    return sorted(name for name, _ in _listing(dir_fd))


def owned_dir(path: str, uid: int) -> bool:
    """Is ``path`` a real dir (reached by the walk, itself no link) owned by ``uid``?"""
    try:
        parent, name = split(path)
        fd = open_dir(parent)
    except UnsafePath:
        return False
    try:
        entry = look(fd, name)
    finally:
        os.close(fd)
    return entry.kind == "dir" and entry.uid == uid
