"""Who a directory should belong to and who a daemon should run as, from the config.

``mps.dir_owner`` and ``mps.daemon_user`` take a user name, a uid, ``job`` (the job's
user, per-job layout) or ``any`` (not checked: root for what we create).
"""

from typing import NamedTuple, Optional


class User(NamedTuple):
    uid: int
    gid: int
    name: str
    home: str = "/"


class UserError(ValueError):
    pass


ROOT = User(0, 0, "root", "/root")


def by_uid(uid: int) -> User:
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return User(uid, uid, str(uid), "/")  # no passwd entry: its own group, as useradd does
    return User(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir or "/")


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
    import pwd

    try:
        pw = pwd.getpwnam(spec)
    except KeyError:
        raise UserError(f"{key} names user '{spec}', who does not exist on this node") from None
    return User(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir or "/")


def groups_of(user: User) -> tuple:
    """Supplementary groups of ``user`` (for the daemon it runs, as a login would give)."""
    if user.uid == 0:
        return ()
    import os

    try:
        return tuple(g for g in os.getgrouplist(user.name, user.gid) if g != user.gid)
    except (OSError, KeyError):
        return ()
