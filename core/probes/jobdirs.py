"""Per-job pipe and log dirs on disk, with owner and age, for the orphans check.

Both templates' parent dirs are listed (a job's log dir can outlive its pipe dir).
Entries are lstat'ed, never followed: a symlink is reported as one, not as its target.
"""

import os
from typing import List, NamedTuple, Optional, Tuple

from ..context import Context
from ..templates import match
from .dirs import kind_of


class JobDir(NamedTuple):
    job_id: str
    role: str  # "pipe" | "log"
    path: str  # as configured (without --root)
    kind: str  # "dir" | "symlink" | "file" | ...
    uid: int
    owner: Optional[str]
    mtime: float  # Unix time of the last change: the dir's age for the orphans check


def read_job_dirs(ctx: Context) -> Tuple[JobDir, ...]:
    mps = ctx.config.mps
    if mps.layout != "per-job":
        return ()
    found: List[JobDir] = []
    seen = set()
    for role, template in (("pipe", mps.pipe_dir), ("log", mps.log_dir)):
        parent = os.path.dirname(template)
        try:
            names = sorted(os.listdir(ctx.path(parent)))
        except OSError:
            continue
        for name in names:
            fields = match(template, name)
            path = os.path.join(parent, name)
            if fields is None or path in seen:
                continue
            seen.add(path)
            try:
                st = os.lstat(ctx.path(path))
            except OSError:
                continue  # removed while we looked
            found.append(JobDir(fields[0], role, path, kind_of(st.st_mode), st.st_uid,
                                _name_of(st.st_uid), st.st_mtime))
    return tuple(found)


def gather(ctx: Context, instances: object) -> Tuple[JobDir, ...]:
    return read_job_dirs(ctx)


VALUE_TYPE = Tuple[JobDir, ...]


def _name_of(uid: int) -> Optional[str]:
    from ..users import name_of  # lazy: no NamedTuple built on the plain check's path

    return name_of(uid)
