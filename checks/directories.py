"""directories: pipe and log dirs are real directories with the expected mode and owner.

A symlinked pipe dir lets whoever planted it redirect every client's socket, so it is
CRITICAL. A pipe path too long for AF_UNIX (108 bytes with the NUL, and the daemon
adds '/control_privileged') makes the daemon fail to start.
"""

from __future__ import annotations

from mps_health.config import Config
from mps_health.facts import DirFact, Facts, Instance
from mps_health.results import CRITICAL, WARNING, Result, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, Mapping, Optional

NAME = "directories"
SUN_PATH_MAX = 108  # bytes in sockaddr_un.sun_path, NUL included
LONGEST_ENTRY = "control_privileged"
SOCKETS = ("control", "control_privileged")


def expected_owner(owner: str) -> Optional[int]:
    if owner in ("job", "any"):
        return None  # per-job dirs belong to the job's user: the daemon check compares
    if owner.isdigit():
        return int(owner)
    import pwd

    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        return None


def _reset(inst: Instance) -> str:
    return f"run 'mps-health remediate reset {inst.name}' (dry run first: --dry-run)"


def judge_dir(inst: Instance, role: str, d: Optional[DirFact], config: Config) -> Iterator[Result]:
    """Findings for one dir; ``role`` is "pipe" or "log"."""
    if d is None or d.kind == "missing":
        severity = CRITICAL if role == "pipe" else WARNING
        yield Result(NAME, severity, f"{role}-dir-missing", inst.name,
                     f"{role} dir {d.path if d else '?'} does not exist", _reset(inst),
                     (("dir_ok", 0.0),))
        return
    if d.kind == "error":
        yield Result(NAME, WARNING, f"{role}-dir-unreadable", inst.name,
                     f"cannot lstat {role} dir {d.path}: {d.error}", "run the check as root")
        return
    if d.kind == "symlink":
        yield Result(NAME, CRITICAL, f"{role}-dir-symlink", inst.name,
                     f"{role} dir {d.path} is a symlink to {d.link_target}: it may redirect "
                     "MPS sockets or logs", _reset(inst) + "; it moves the link aside",
                     (("dir_ok", 0.0),))
        return
    if d.kind != "dir":
        yield Result(NAME, CRITICAL, f"{role}-dir-not-dir", inst.name,
                     f"{role} dir {d.path} is a {d.kind}, not a directory", _reset(inst),
                     (("dir_ok", 0.0),))
        return
    found = False
    want_mode = config.mps.dir_mode
    if d.mode != want_mode:
        found = True
        severity = CRITICAL if role == "pipe" else WARNING
        yield Result(NAME, severity, f"{role}-dir-mode", inst.name,
                     f"{role} dir {d.path} has mode {d.mode:04o}, expected {want_mode:04o}"
                     + (": other users' clients cannot connect" if role == "pipe" else ""),
                     _reset(inst), (("dir_ok", 0.0),))
    want_uid = expected_owner(config.mps.dir_owner)
    if want_uid is not None and d.uid != want_uid:
        found = True
        yield Result(NAME, WARNING, f"{role}-dir-owner", inst.name,
                     f"{role} dir {d.path} is owned by {d.owner or d.uid}, expected "
                     f"{config.mps.dir_owner}", _reset(inst), (("dir_ok", 0.0),))
    if role == "pipe":
        for e in d.entries:
            if e.kind == "symlink" or (e.name in SOCKETS and e.kind not in ("socket",)):
                found = True
                yield Result(NAME, CRITICAL, "pipe-entry-bad", inst.name,
                             f"{d.path}/{e.name} is a {e.kind}, expected a socket"
                             if e.kind != "symlink" else f"{d.path}/{e.name} is a symlink",
                             _reset(inst), (("dir_ok", 0.0),))
    if not found:
        yield ok(NAME, inst.name, f"{role} dir {d.path} is a directory, mode {d.mode:04o}, "
                 f"owner {d.owner or d.uid}", dir_ok=1.0)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    dirs: Mapping[str, DirFact] = facts.get("dirs")
    for inst in facts.instances:
        longest = len(inst.pipe_dir.encode()) + 1 + len(LONGEST_ENTRY) + 1
        if longest > SUN_PATH_MAX:
            yield Result(NAME, CRITICAL, "pipe-path-too-long", inst.name,
                         f"pipe dir {inst.pipe_dir} is too long for a unix socket path "
                         f"({longest} bytes with '/{LONGEST_ENTRY}', limit {SUN_PATH_MAX})",
                         "use a shorter pipe dir in the config")
        yield from judge_dir(inst, "pipe", dirs.get(inst.pipe_dir), config)
        yield from judge_dir(inst, "log", dirs.get(inst.log_dir), config)
