"""Users and uids: the one place mps-health asks the passwd and group databases.

Config values (``mps.dir_owner``, ``mps.daemon_user``, ``canary.user``) take a user
name, a uid, ``job`` (the job's user, per-job layout) or ``any`` (not checked: root for
what we create). A uid without a passwd entry is still a user (its own group, home
``/``), as ``useradd`` would make it; names are looked up once per run.
"""

from __future__ import annotations

import functools
import os
import pwd
from typing import NamedTuple, Optional, Tuple


class User(NamedTuple):
    uid: int
    gid: int
    name: str
    home: str = "/"


class UserError(ValueError):
    pass


ROOT = User(0, 0, "root", "/root")


@functools.cache
def name_of(uid: Optional[int]) -> Optional[str]:
    """The user name of ``uid``; None without a passwd entry (cached for the run)."""
    try:
        return None if uid is None else pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@functools.cache
def _uid_by_name(name: str) -> int:
    return pwd.getpwnam(name).pw_uid  # KeyError: not cached, asked again next time


def uid_of(spec: str) -> Optional[int]:
    """The uid a user name or number names; None if nobody. A name found is kept for the
    process (each lookup reads the passwd file anew); one not found is asked again."""
    if spec.isdigit():
        return int(spec)
    try:
        return _uid_by_name(spec)
    except KeyError:
        return None


def _user(pw: pwd.struct_passwd) -> User:
    return User(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir or "/")


def by_uid(uid: int) -> User:
    try:
        return _user(pwd.getpwuid(uid))
    except KeyError:
        return User(uid, uid, str(uid), "/")  # no passwd entry: its own group, as useradd does


def resolve(spec: str, job_uid: Optional[int] = None, key: str = "mps.daemon_user") -> User:
    """The user a config value names; UserError with one line if it names nobody."""
    if spec == "any":
        return ROOT
    if spec == "job":
        if job_uid is None:
            raise UserError(f"{key} is 'job' but the job's user is not known")
        return by_uid(job_uid)
    if spec.isdigit():
        return by_uid(int(spec))
    try:
        return _user(pwd.getpwnam(spec))
    except KeyError:
        raise UserError(f"{key} names user '{spec}', who does not exist on this node") from None


def groups_of(user: User) -> Tuple[int, ...]:
    """The groups a login of ``user`` would have (primary included); only the primary
    one without a passwd/group entry."""
    try:
        return tuple(sorted(set(os.getgrouplist(user.name, user.gid))))
    except (OSError, KeyError):
        return (user.gid,)
