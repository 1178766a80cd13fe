"""Per-job pipe and log dirs on disk, with owner and age, for the orphans check.

Both templates' parent dirs are listed (a log dir can outlive its pipe dir), entries by
lstat (a symlink is reported as one). With them, the Prolog's records of which job and
uid each dir was made for (``job_records``): a name alone makes no dir ours.
"""

import os
from typing import List, NamedTuple, Optional, Tuple

from mps_health.hostio.jobrecords import JobRecord
from mps_health.hostio.jobrecords import load as load_records
from mps_health.hostio.safedirs import kind_of
from mps_health.probes.context import Context
from mps_health.probes.dirs import owner_name
from mps_health.probes.instances import matching


class JobDir(NamedTuple):
    job_id: str
    role: str  # "pipe" | "log"
    path: str  # as configured (without --root)
    kind: str  # "dir" | "symlink" | "file" | ...
    uid: int
    owner: Optional[str]
    mtime: float  # Unix time of the last change: the dir's age for the orphans check


def gather(ctx: Context, instances: object) -> Tuple[JobDir, ...]:
    mps = ctx.config.mps
    if mps.layout != "per-job":
        return ()
    found: List[JobDir] = []
    seen = set()
    for role, template in (("pipe", mps.pipe_dir), ("log", mps.log_dir)):
        for path, fields in matching(ctx, template):
            if path in seen:
                continue
            seen.add(path)
            try:
                st = os.lstat(ctx.path(path))
            except OSError:
                continue  # removed while we looked
            found.append(JobDir(fields[0], role, path, kind_of(st.st_mode), st.st_uid,
                                owner_name(st.st_uid), st.st_mtime))
    return tuple(found)


VALUE_TYPE = Tuple[JobDir, ...]


class JobRecords(NamedTuple):
    """The jobs the Prolog recorded (``mps_health.hostio.jobrecords``): which dirs are ours."""

    records: Tuple[JobRecord, ...]
    error: str = ""  # why the records could not be read ("" when fine or none yet)
    denied: bool = False  # an unprivileged run was refused them (root's runs can read)


def gather_records(ctx: Context, instances: object) -> JobRecords:
    if ctx.config.mps.layout != "per-job":
        return JobRecords(())
    records, error = load_records(ctx.path(ctx.config.state_dir))
    return JobRecords(records, error, bool(error) and os.geteuid() != 0
                      and "denied" in error)


RECORDS_TYPE = JobRecords
