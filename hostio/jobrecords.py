"""Which per-job dirs are ours: what the Prolog made, for which job and which user.

Anyone can make a dir in ``/tmp`` named like any job's, so a name proves nothing: the
Prolog records each job in ``state_dir/jobs.json`` (the job id, its uid as Slurm gave
it, the dirs made); the Epilog and ``remediate orphans`` drop the record once those
dirs are gone. A leftover dir is judged only when the record names it and it belongs to
the recorded uid or root (``ours``, the one rule); anything else is never CRITICAL,
never removed by root. The file is bounded (``MAX_RECORDS``, ``MAX_DIRS``, ``MAX_BYTES``),
written by ``state.StateFile``, and read only when a regular file (no link followed) in
a dir walked by ``safedirs``, owned by root or us and writable by no one else. Recording
is best effort for the hooks: a failure is one line to log, never fatal.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Sequence, Tuple

NAME = "jobs"
MAX_RECORDS = 2048  # jobs that ran here and whose dirs may still exist
MAX_DIRS = 64  # a pipe and a log dir per GPU
MAX_BYTES = 2 << 20


class JobRecord(NamedTuple):
    """A job the Prolog set up: its id, its user's uid (Slurm's), the dirs it made."""

    job_id: str
    uid: int
    dirs: Tuple[str, ...]  # absolute, normalised, as configured (without --root)
    at: float  # Unix time of the record


VALUE_TYPE = Tuple[JobRecord, ...]


def ours(record: Optional[JobRecord], path: str, owner_uid: int) -> bool:
    """Is the dir at ``path``, owned by ``owner_uid``, one the Prolog made for the job of
    ``record``? (pure: the one rule for the orphans check and ``remediate orphans``)"""
    return (record is not None and os.path.normpath(path) in record.dirs
            and owner_uid in (record.uid, 0))


def by_job(records: Iterable[JobRecord]) -> Dict[str, JobRecord]:
    """{job id: its record} (the newest, should a job have been recorded twice)."""
    return {r.job_id: r for r in sorted(records, key=lambda r: r.at)}


def keep(records: Sequence[JobRecord]) -> Tuple[JobRecord, ...]:
    """Valid records, one per job (the newest), the newest ``MAX_RECORDS``."""
    valid = [r for r in records if r.job_id.isdigit() and r.uid >= 0 and r.dirs
             and len(r.dirs) <= MAX_DIRS and all(d.startswith("/") for d in r.dirs)
             and r.at == r.at]  # nan is no time
    return tuple(sorted(by_job(valid).values(), key=lambda r: r.at)[-MAX_RECORDS:])


def load(state_dir: str) -> Tuple[Tuple[JobRecord, ...], str]:
    """The records, and '' or one line saying why none could be read (missing: none)."""
    from mps_health.hostio.safedirs import UnsafePath, open_dir
    from mps_health.hostio.safefiles import open_regular, read_upto
    from mps_health.model import codec

    try:
        dfd = open_dir(state_dir)
    except UnsafePath as e:
        return (), "" if e.errno == errno.ENOENT else f"job records not read: {e}"
    except OSError as e:
        return (), f"job records not read: {state_dir}: {e.strerror}"
    path = os.path.join(state_dir, NAME + ".json")
    try:
        fd, st = open_regular(NAME + ".json", dfd)
    except FileNotFoundError:
        return (), ""
    except OSError as e:
        return (), f"job records not read: {path}: {e.strerror or e} (a link or not a file?)"
    finally:
        os.close(dfd)
    try:
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return (), (f"job records not read: {path} is owned by uid {st.st_uid} with "
                        f"mode {stat.S_IMODE(st.st_mode):04o}: only root's own file is trusted")
        raw = read_upto(fd, MAX_BYTES, st.st_size)  # at most one byte too many
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return (), f"job records not read: {path} is larger than {MAX_BYTES} bytes"
    try:
        data = json.loads(raw.decode("utf-8"))
        return keep(codec.decode(VALUE_TYPE, data, path)), ""
    except (ValueError, RecursionError, codec.DecodeError) as e:
        return (), f"job records not read: {path} is damaged ({e})"


def _change(state_dir: str, wait_s: float,
            change: Callable[[Tuple[JobRecord, ...]], Sequence[JobRecord]]) -> str:
    """Apply ``change(records) -> records`` under the lock; '' or why it was not saved."""
    from mps_health.hostio.state import StateFile

    errors = []

    def changed() -> Tuple[JobRecord, ...]:
        old, error = load(state_dir)
        errors.append(error)  # a file we could not trust is replaced by the rename
        return keep(change(old))

    problem = StateFile(state_dir, NAME).update(wait_s, changed)
    if problem:
        return f"job record not kept: {problem}"
    return f"{errors[0]}; written afresh" if errors and errors[0] else ""


def add(state_dir: str, job_id: str, uid: int, dirs: Sequence[str], wait_s: float = 10.0
        ) -> str:
    """Record that the Prolog made ``dirs`` for job ``job_id`` of ``uid`` (adding to the
    job's record); '' or one line to log. Records whose dirs are all gone are pruned."""
    now = time.time()
    made = tuple(os.path.normpath(d) for d in dirs)

    def change(old: Tuple[JobRecord, ...]) -> Tuple[JobRecord, ...]:
        kept = [r for r in old if r.job_id != job_id
                and (now - r.at < 60.0 or any(os.path.lexists(d) for d in r.dirs))]
        before = by_job(old).get(job_id)
        has = before.dirs if before is not None and before.uid == uid else ()
        both = tuple(dict.fromkeys((*has, *made)))[:MAX_DIRS]
        return (*kept, JobRecord(job_id, uid, both, now))

    return _change(state_dir, wait_s, change)


def drop(state_dir: str, job_id: str, left: Sequence[str] = (), wait_s: float = 10.0) -> str:
    """Forget job ``job_id`` once its dirs are gone; with ``left`` (dirs that could not be
    removed) keep only those in its record. '' or one line to log."""
    still = {os.path.normpath(d) for d in left}

    def change(old: Tuple[JobRecord, ...]) -> Tuple[JobRecord, ...]:
        out = []
        for r in old:
            if r.job_id != job_id:
                out.append(r)
            elif still & set(r.dirs):
                out.append(r._replace(dirs=tuple(d for d in r.dirs if d in still)))
        return tuple(out)

    return _change(state_dir, wait_s, change)
