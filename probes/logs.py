"""control.log and server.log, read incrementally: only the bytes written since last run.

Where reading stopped is saved per file as (device, inode, offset) in state_dir/logs.json,
so a finding is never reported twice. A new inode means rotated: the rest of the old file
is read from its new name first; a file shorter than the offset was truncated. At most
``max_read_bytes`` (the newest) are read per file and run. Notable lines become findings,
remembered for ``window_s`` and judged by the logs check.
"""

from __future__ import annotations

import os
import re
import stat
import time
from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple

from mps_health.config.deep_checks import LOGS, LogsConfig
from mps_health.config.load import Config
from mps_health.hostio.resources import raise_if_starved
from mps_health.model.facts import Instance
from mps_health.model.facts_deep import (
    LOG_FILES,
    LogFileFact,
    LogFinding,
    LogMemory,
    LogPosition,
    LogsFacts,
)
from mps_health.probes.context import Context

PENDING_KEEP_S = 86400.0  # a pending client still alive is remembered up to a day
HEAD_BYTES = 64  # a file's first bytes, to tell a replaced file that reused the inode


def settings(config: Config) -> LogsConfig:
    return config.get(LOGS)


# --- parse (pure) ---------------------------------------------------------------------

def parse_time(date: str, clock: str) -> Optional[float]:
    """'2026-12-02' '12:28:16.570' (local time, as the daemon writes it) -> Unix time."""
    whole, _, frac = clock.partition(".")
    try:  # strptime checks the ranges; isdst -1: mktime decides
        t = time.mktime(time.strptime(f"{date} {whole}", "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None
    return t + (float("0." + frac) if frac.isdigit() else 0.0)


def split_line(line: str) -> Optional[Tuple[str, str, str, str]]:
    """``[2026-12-02 12:28:16.570 Control   436] text`` -> (date, clock, role, text)."""
    close = line.find("]")
    head = line[1:close].split() if line.startswith("[") and close > 0 else []
    return (head[0], head[1], head[2], line[close + 1:].strip()) if len(head) == 4 else None


def _int_after(text: str, marker: str, default: int) -> int:
    """The number right after the first ``marker``: ASCII digits, at most 18 (a per-job
    daemon's log is its user's file: what int() refuses is no number, never an error)."""
    at = text.find(marker)
    found = re.match(r"[0-9]{1,18}", text[at + len(marker):]) if at >= 0 else None
    return int(found.group()) if found else default


def classify(text: str) -> Optional[Tuple[str, int, int, int]]:
    """A message's (code, pid, uid, status), or None when it is not worth keeping."""
    if text.startswith("NEW CLIENT ") and "push client to pending list" in text:
        return ("log-pending-client", _int_after(text, "NEW CLIENT ", 0),
                _int_after(text, " from user ", -1), 0)
    if text.startswith("Starting new server "):
        return ("log-server-start", _int_after(text, "Starting new server ", 0),
                _int_after(text, " for user ", -1), 0)
    if text.startswith("Server ") and " exited with status " in text:
        status = _int_after(text, " exited with status ", 0)  # 0: ended with its clients
        return ("log-server-exit", _int_after(text, "Server ", 0), -1, status) if status else None
    if text.startswith("Exit with status "):
        status = _int_after(text, "Exit with status ", 0)
        return ("log-daemon-exit", 0, -1, status) if status else None
    if "Failed to start server using uid" in text:
        return "log-server-start-failed", 0, _int_after(text, "using uid ", -1), 0
    if text.startswith("Cmd:set_default_device_pinned_mem_limit "):
        # Kept, not reported: checks/limits.py judges the device IDs the defaults were
        # set on (the daemon's answers give only the value that won) ...
        return "log-pinned-limit-set", 0, -1, 0
    if text.startswith("Starting control daemon "):
        # ... and only those of the daemon that runs now: a new daemon starts without.
        return "log-daemon-start", 0, -1, 0
    if "Unable to accept connection" in text:
        return "log-accept-failed", 0, -1, 0
    lowered = text.lower()
    if "fatal" in lowered or "exception" in lowered:
        return "log-fatal", 0, -1, 0
    return None


def parse_findings(text: str, log_dir: str, file: str, read_at: float) -> List[LogFinding]:
    """Findings in a chunk of whole lines; a line without a usable time gets ``read_at``."""
    found: List[LogFinding] = []
    for fields in filter(None, map(split_line, text.splitlines())):
        date, clock, _role, message = fields
        kind = classify(message)
        if kind is None:
            continue
        # Dated only once a finding: parsing the time costs most of what a line takes.
        at = parse_time(date, clock)
        if at is None or at > read_at + 86400:
            at = read_at  # a clock or timezone we cannot trust: date it by reading
        code, pid, uid, status = kind
        found.append(LogFinding(at, code, log_dir, file, message[:300], pid, uid, status))
    return found


# --- read (I/O) -----------------------------------------------------------------------

MAX_ENTRIES = 1024  # entries of a log dir looked at: a dir a user filled costs a bound
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotTheDaemons(OSError):
    """A log file that is not the daemon's user's regular file: never read."""

    def __init__(self, st: os.stat_result) -> None:
        self.what, self.uid = _what(st), st.st_uid
        super().__init__(self.what)


KINDS = {stat.S_IFLNK: "symlink", stat.S_IFREG: "file", stat.S_IFDIR: "directory",
         stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


def _what(st: os.stat_result) -> str:
    kind = KINDS.get(stat.S_IFMT(st.st_mode), "device or other")
    links = f" with {st.st_nlink} links" if kind == "file" and st.st_nlink > 1 else ""
    return f"a {kind} owned by uid {st.st_uid}{links}"


def ours(st: os.stat_result, owners: Optional[AbstractSet[int]]) -> bool:
    """Is this lstat/fstat the daemon's own log: a regular file of ``owners`` (its user)
    with one link (a hard link would make the daemon append to another file)?"""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (
        owners is None or st.st_uid in owners)


def _open(name: str, dir_fd: int, owners: Optional[AbstractSet[int]]
          ) -> Tuple[int, os.stat_result]:
    from mps_health.hostio.safefiles import open_regular

    fd, st = open_regular(name, dir_fd)  # O_NOFOLLOW, O_NONBLOCK, regular files only
    if not ours(st, owners):
        os.close(fd)
        raise NotTheDaemons(st)
    return fd, st


def scan(dir_fd: int) -> Tuple[List[Tuple[str, os.stat_result]], bool]:
    """The first ``MAX_ENTRIES`` entries of a log dir with their lstat; were there more?"""
    found: List[Tuple[str, os.stat_result]] = []
    dup = os.dup(dir_fd)  # scandir(fd) rewinds but closes nothing: use a copy
    try:
        with os.scandir(dup) as it:
            for entry in it:
                if len(found) >= MAX_ENTRIES:
                    return found, True
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue  # gone meanwhile
    finally:
        os.close(dup)
    return found, False


def _read_range(fd: int, start: int, end: int, max_bytes: int) -> Tuple[str, int, str]:
    """Whole lines of [start, end), at most the last ``max_bytes``: (text, next, note)."""
    skipped = max(0, end - start - max_bytes)
    note = f"skipped {skipped} bytes (more than {max_bytes} new)" if skipped else ""
    start += skipped
    data = os.pread(fd, end - start, start) if end > start else b""
    if skipped:
        cut = data.find(b"\n")  # we landed mid-line: drop its tail
        data, start = (data[cut + 1:], start + cut + 1) if cut >= 0 else (b"", end)
    last = data.rfind(b"\n")
    if last < 0:
        return "", start, note  # no whole line yet: read it next run
    return data[:last + 1].decode("utf-8", "replace"), start + last + 1, note


def _rotated(dir_fd: int, name: str, pos: LogPosition) -> Optional[str]:
    """The old file's new name (same device and inode), if it is still there."""
    try:
        entries, _ = scan(dir_fd)
    except OSError:
        return None
    return next((other for other, st in sorted(entries)
                 if other != name and other.startswith(name)
                 and not other.endswith((".gz", ".xz"))
                 and (st.st_dev, st.st_ino) == (pos.dev, pos.inode)), None)


def read_file(real_dir: str, name: str, pos: Optional[LogPosition], max_bytes: int,
              owners: Optional[AbstractSet[int]] = None
              ) -> Tuple[List[Tuple[str, str]], LogPosition, str]:
    """New text of ``real_dir/name``: ([(file name, text), ...], next position, note).
    Never through a link; with ``owners``, only their regular file (another user's file
    would forge findings), else NotTheDaemons. OSError when it cannot be read."""
    dir_fd = os.open(real_dir, DIR_FLAGS)
    try:
        return _read_in(dir_fd, name, pos, max_bytes, owners)
    finally:
        os.close(dir_fd)


def _read_in(dir_fd: int, name: str, pos: Optional[LogPosition], max_bytes: int,
             owners: Optional[AbstractSet[int]]
             ) -> Tuple[List[Tuple[str, str]], LogPosition, str]:
    fd, st = _open(name, dir_fd, owners)
    chunks: List[Tuple[str, str]] = []
    notes: List[str] = []
    try:
        start = 0
        head = os.pread(fd, min(st.st_size, HEAD_BYTES), 0).decode("latin-1")
        if pos is None:
            notes.append("first read")  # from the start, bounded to the newest bytes
        elif (pos.dev, pos.inode) == (st.st_dev, st.st_ino) and st.st_size >= pos.offset \
                and not head.startswith(pos.head):
            # Same inode, new beginning: replaced (inode reused) or truncated and refilled.
            notes.append("replaced or truncated and rewritten")
        elif (pos.dev, pos.inode) != (st.st_dev, st.st_ino):
            old = _rotated(dir_fd, name, pos)
            if old is not None:
                try:
                    ofd, ost = _open(old, dir_fd, owners)
                    try:
                        text, _next, note = _read_range(ofd, pos.offset, ost.st_size, max_bytes)
                    finally:
                        os.close(ofd)
                    chunks.append((old, text))
                    notes.append(f"rotated: read the rest of {old}" + (f", {note}" * bool(note)))
                except OSError:
                    notes.append(f"rotated: {old} unreadable")
            else:
                notes.append("rotated: the old file is gone")
        elif st.st_size < pos.offset:
            notes.append(f"truncated (was {pos.offset} bytes, now {st.st_size})")
        else:
            start = pos.offset
        text, next_offset, note = _read_range(fd, start, st.st_size, max_bytes)
        if note:
            notes.append(note)
        elif notes == ["first read"]:
            notes = []
        chunks.append((name, text))
    finally:
        os.close(fd)
    return chunks, LogPosition(st.st_dev, st.st_ino, next_offset, head), "; ".join(notes)


FUTURE_SLACK_S = 300.0  # a log line's clock may be this far ahead of ours
# The daemon logs every query (ours too): offsets alone are saved only once a file moved
# on this far, sparing a write per run. Lines read again held no finding the first time.
SAVE_AFTER_BYTES = 4096


def worth_saving(memory: LogMemory, positions: Dict[str, LogPosition],
                 kept: Tuple[LogFinding, ...]) -> bool:
    """Must ``positions`` and ``kept`` be written over ``memory``?"""
    if kept != memory.findings or positions.keys() != memory.positions.keys():
        return True
    for name, pos in positions.items():
        old = memory.positions[name]
        if pos._replace(offset=0) != old._replace(offset=0) \
                or not 0 <= pos.offset - old.offset <= SAVE_AFTER_BYTES:
            return True  # another file, a rotation, a truncation, or far enough
    return False


def log_owners(config: Config, dir_uid: int) -> Optional[AbstractSet[int]]:
    """Who may own the daemon's logs in a dir owned by ``dir_uid``: ``mps.daemon_user``
    ("job": the dir's owner); with "any", or an unknown user, root or the dir's owner."""
    from mps_health.probes.instances import daemon_uid

    uid = daemon_uid(config.mps.daemon_user, dir_uid)
    return {uid} if uid is not None else {0, dir_uid}


def foreign_entries(log_dir: str, entries: Sequence[Tuple[str, os.stat_result]],
                    owners: Optional[AbstractSet[int]]) -> List[LogFileFact]:
    """A log dir's links and entries not of the daemon's user (the two logs apart): only
    the daemon writes there, so anything else is a plant, reported and never read."""
    return [LogFileFact(os.path.join(log_dir, name), "foreign", _what(st), 0, st.st_uid)
            for name, st in entries if name not in LOG_FILES and (
                stat.S_ISLNK(st.st_mode) or (owners is not None and st.st_uid not in owners))]


def _read_dir(ctx: Context, log_dir: str, memory: LogMemory, cfg: LogsConfig, now: float,
              files: List[LogFileFact], foreign: List[LogFileFact],
              positions: Dict[str, LogPosition], new: List[LogFinding]) -> None:
    """Read the daemon's two logs in one log dir (only its user's regular files), and name
    what else is there; OSError when the dir itself cannot be opened or listed."""
    dir_fd = os.open(ctx.path(log_dir), DIR_FLAGS)
    try:
        owners = log_owners(ctx.config, os.fstat(dir_fd).st_uid)
        entries, _ = scan(dir_fd)  # bounded: the first MAX_ENTRIES
        foreign.extend(foreign_entries(log_dir, entries, owners))
        for name in LOG_FILES:
            shown = os.path.join(log_dir, name)
            try:
                seen = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not ours(seen, owners):  # a link, FIFO, dir, another user's file: not read
                    raise NotTheDaemons(seen)
                chunks, pos, note = _read_in(dir_fd, name, memory.positions.get(shown),
                                             int(cfg.max_read_bytes), owners)
            except FileNotFoundError:
                files.append(LogFileFact(shown, "missing"))
            except NotTheDaemons as e:  # not the daemon's, or replaced after our look
                files.append(LogFileFact(shown, "bad", e.what, 0, e.uid))
            except OSError as e:
                files.append(LogFileFact(shown, "error", f"cannot read: {e.strerror}"))
            else:
                positions[shown] = pos
                for file_name, text in chunks:
                    new.extend(parse_findings(text, log_dir, file_name.split(".log")[0] + ".log",
                                              now))
                files.append(LogFileFact(shown, "read", note, sum(len(t) for _, t in chunks)))
    finally:
        os.close(dir_fd)


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> LogsFacts:
    from mps_health.hostio.state import StateFile

    cfg = settings(ctx.config)
    now = time.time()
    state = StateFile(ctx.path(ctx.config.state_dir), "logs")
    locked = not ctx.read_only and state.lock(min(time.monotonic() + 1.0, ctx.deadline))
    memory, error = state.load(LogMemory, LogMemory({}, ())) \
        if not ctx.read_only else (LogMemory({}, ()), "")
    positions: Dict[str, LogPosition] = {}
    files: List[LogFileFact] = []
    new: List[LogFinding] = []
    foreign: List[LogFileFact] = []
    for log_dir in dict.fromkeys(i.log_dir for i in instances):
        both = [os.path.join(log_dir, n) for n in LOG_FILES]
        try:
            _read_dir(ctx, log_dir, memory, cfg, now, files, foreign, positions, new)
        except FileNotFoundError:  # the directories check reports a missing log dir
            files.extend(LogFileFact(p, "missing") for p in both)
        except OSError as e:
            raise_if_starved(e, f"read {log_dir}")  # our want of fds is no fact of the dir
            # A per-job log dir belongs to a user: never read where a link points as root.
            why = "the log dir is a symlink" if os.path.islink(ctx.path(log_dir)) \
                else e.strerror
            files.extend(LogFileFact(p, "error", f"cannot read: {why}") for p in both)
    # A finding dated in the future (clock stepped back, damaged logs.json) would stay
    # "recent" for ever: dropped, as is nan or infinity (they fail the comparison).
    merged = {f: None for f in (*memory.findings, *new)
              if 0 <= f.at <= now + FUTURE_SLACK_S}
    alive = tuple(sorted({f.pid for f in merged if f.code == "log-pending-client"
                          and f.pid > 0 and os.path.exists(f"{ctx.proc}/{f.pid}")}))
    kept = tuple(f for f in merged
                 if now - f.at <= cfg.window_s
                 or (f.code == "log-pending-client" and f.pid in alive
                     and now - f.at <= PENDING_KEEP_S))
    facts = LogsFacts(now, tuple(files), kept, alive, error or state.error, tuple(foreign))
    if locked:
        saved = state.save(LogMemory(positions, kept)) \
            if worth_saving(memory, positions, kept) else ""
        state.unlock()
        if saved:
            facts = facts._replace(state_error=saved)
    return facts


VALUE_TYPE = LogsFacts
