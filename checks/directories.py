"""directories: pipe and log dirs are real directories with the expected mode and owner.

A symlinked pipe dir lets whoever planted it redirect every client's socket: CRITICAL.
A pipe path too long for AF_UNIX makes the daemon fail to start. Pipe dirs have
``mps.dir_mode`` (0777: every user's clients connect); log dirs ``mps.log_dir_mode``
(0755, else a WARNING): a log dir others can write lets them plant the control.log the
root daemon appends to. Each fault names the repair that changes only what is wrong.

Pipe dirs are world-writable, so entries are judged by name, kind and owner: MPS's own
names (``OWN_ENTRIES``) of the wrong kind or owner mean clients or root's queries may
reach someone else (a user who renames ``control`` and binds their own socket answers
every query): CRITICAL. Any other entry touches nothing MPS uses: a WARNING, no drain.
"""

from __future__ import annotations

import pwd
from typing import FrozenSet, Iterator, List, Mapping, Optional

from mps_health.checks.common import reset_action
from mps_health.config.load import LONGEST_ENTRY, SUN_PATH_MAX, Config, socket_path_bytes
from mps_health.engine import registry
from mps_health.engine.actionhints import Advice, advice
from mps_health.model.facts import DirFact, Facts, Instance
from mps_health.model.results import CRITICAL, WARNING, Result, ok
from mps_health.probes.instances import daemon_uid, expected_uid

NAME = "directories"
CODES = (*(f"{role}-dir-{what}" for role in ("pipe", "log")
           for what in ("missing", "mode", "not-dir", "owner", "symlink", "unreadable")),
         "pipe-dir-parent", "log-dir-parent",
         "pipe-entry-bad", "pipe-entry-foreign", "pipe-entry-owner", "pipe-path-too-long")

registry.check(NAME, f"{__name__}:check", ("dirs",), order=40,
               summary="pipe and log dirs are real dirs with the right mode and owner")

# What the daemon itself creates in its pipe dir, and the kind each must be.
OWN_ENTRIES = {"control": "socket", "control_privileged": "socket", "control_lock": "file",
               "log": "fifo", "nvidia-cuda-mps-control.pid": "file"}
BAD = (("dir_ok", 0.0),)  # the values of a finding that the dir is not right


def log_dir_owner(config: Config) -> str:
    """The daemon's user, who alone writes there; ``mps.dir_owner`` when any user may."""
    return config.mps.dir_owner if config.mps.daemon_user == "any" else config.mps.daemon_user


def _dirs(inst: Instance) -> Advice:
    return advice("run ", ("mps-health", "remediate", "dirs", inst.name), " (dry run first: "
                  "--dry-run); the daemon and its clients keep running")


def repair_of(role: str, kind: str, trusted_owner: bool) -> str:
    """Which repair puts a dir fault right (the one rule for this check and both
    remediations). "dirs" keeps the daemon running: a trusted owner's dir gets its mode
    and owner through its fd, a missing log dir is made. Anything else is "reset": a
    broken pipe dir's sockets are gone or in another user's hands (moved aside, never
    adopted), and only a restart makes the daemon open its logs anew."""
    return "dirs" if (kind == "dir" and trusted_owner) or (role, kind) == ("log", "missing") \
        else "reset"


def trusted_uids(config: Config) -> FrozenSet[int]:
    """Owners whose dir is repaired in place: root, ``mps.dir_owner``, ``mps.daemon_user``."""
    uids = (daemon_uid(owner, None) for owner in (config.mps.dir_owner, config.mps.daemon_user))
    return frozenset({0, *(uid for uid in uids if uid is not None)})


def judge_parents(inst: Instance, role: str, d: DirFact) -> Iterator[Result]:
    """A parent others cannot traverse (``DirFact.blocked``): every other user's client
    fails to reach the pipe dir (CRITICAL; a log dir's: WARNING). mps-health never made
    these parents, so it never changes them: the chmod is by hand."""
    state, why = (CRITICAL, "every client of another user than its owner fails") if role == "pipe" \
        else (WARNING, "users other than its owner cannot reach the daemon's logs")
    for parent in d.blocked:
        yield Result(NAME, state, f"{role}-dir-parent", inst.name,
                     f"{role} dir {d.path}: its parent {parent.path} has mode "
                     f"{parent.mode:04o} (owner {_owner_name(parent.uid)}), not traversable "
                     f"by other users: {why}",
                     f"run 'chmod o+x {parent.path}' (and find what made it so: a package or "
                     "a tmpfiles.d rule may make it again); mps-health did not make it and "
                     "leaves it alone", BAD)


def judge_dir(inst: Instance, role: str, d: Optional[DirFact], config: Config) -> Iterator[Result]:
    if d is not None and d.blocked:
        yield from judge_parents(inst, role, d)
    reset = reset_action(inst.name)
    if d is None or d.kind == "missing":
        make = reset if role == "pipe" else _dirs(inst)
        yield Result(NAME, CRITICAL if role == "pipe" else WARNING, f"{role}-dir-missing",
                     inst.name, f"{role} dir {d.path if d else '?'} does not exist",
                     make.text, BAD, commands=make.commands)
        return
    if d.kind == "error":
        yield Result(NAME, WARNING, f"{role}-dir-unreadable", inst.name,
                     f"cannot lstat {role} dir {d.path}: {d.error}", "run the check as root")
        return
    if d.kind == "symlink":
        yield Result(NAME, CRITICAL, f"{role}-dir-symlink", inst.name,
                     f"{role} dir {d.path} is a symlink to {d.link_target}: it may redirect "
                     "MPS sockets or logs", reset.text + "; it moves the link aside", BAD,
                     commands=reset.commands)
        return
    if d.kind != "dir":
        yield Result(NAME, CRITICAL, f"{role}-dir-not-dir", inst.name,
                     f"{role} dir {d.path} is a {d.kind}, not a directory", reset.text, BAD,
                     commands=reset.commands)
        return
    owner = config.mps.dir_owner if role == "pipe" else log_dir_owner(config)
    want_uid = daemon_uid(owner, None)  # None: "any", or "job" (the daemon check compares)
    trusted = want_uid is None or d.uid in trusted_uids(config)
    fix = _dirs(inst) if repair_of(role, d.kind, trusted) == "dirs" else reset
    problems: List[Result] = []
    if role == "pipe" and d.mode != config.mps.dir_mode:
        problems.append(Result(NAME, CRITICAL, "pipe-dir-mode", inst.name,
                               f"pipe dir {d.path} has mode {d.mode:04o}, expected "
                               f"{config.mps.dir_mode:04o}: other users' clients cannot connect",
                               fix.text, BAD, commands=fix.commands))
    if role == "log" and d.mode != config.mps.log_dir_mode:
        problems.append(log_mode_result(inst, d, config.mps.log_dir_mode, fix))
    if want_uid is not None and d.uid != want_uid:
        problems.append(Result(NAME, WARNING, f"{role}-dir-owner", inst.name,
                               f"{role} dir {d.path} is owned by {d.owner or d.uid}, expected "
                               f"{owner}", fix.text, BAD, commands=fix.commands))
    if role == "pipe":
        problems += judge_entries(inst, d, config)
    yield from problems
    if not problems and not d.blocked:
        yield ok(NAME, inst.name, f"{role} dir {d.path} is a directory, mode {d.mode:04o}, "
                 f"owner {d.owner or d.uid}", dir_ok=1.0)


def log_mode_result(inst: Instance, d: DirFact, want: int, action: Advice) -> Result:
    """A log dir of another mode than ``mps.log_dir_mode``: a WARNING (only the daemon
    writes there: anyone else's entry is a link it would append to, or a forged line)."""
    why = (": other users can create entries in it (a control.log link the daemon would "
           "append to, or forged log lines)" if d.mode & 0o022 & ~want
           else ": the daemon's user cannot write its logs there" if want & ~d.mode & 0o700
           else "")
    return Result(NAME, WARNING, "log-dir-mode", inst.name,
                  f"log dir {d.path} has mode {d.mode:04o}, expected {want:04o} "
                  f"(mps.log_dir_mode){why}", action.text, BAD, commands=action.commands)


def _owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def judge_entries(inst: Instance, d: DirFact, config: Config) -> Iterator[Result]:
    """MPS's own entries: right kind, daemon's owner (CRITICAL); others: WARNING."""
    want_uid = expected_uid(config.mps.daemon_user, d)
    reset = reset_action(inst.name)
    for e in d.entries:
        where = f"{d.path}/{e.name}"
        want_kind = OWN_ENTRIES.get(e.name)
        if want_kind is None:
            yield Result(NAME, WARNING, "pipe-entry-foreign", inst.name,
                         f"{where} ({e.kind}) belongs to {_owner_name(e.uid)}, not to MPS",
                         "ask its owner why it is there and remove it; MPS does not use it",
                         (("foreign_entries", 1.0),))
        elif e.kind != want_kind:
            yield Result(NAME, CRITICAL, "pipe-entry-bad", inst.name,
                         f"{where} is a {e.kind} owned by {_owner_name(e.uid)}, expected a "
                         f"{want_kind}", reset.text, BAD, commands=reset.commands)
        elif want_uid is not None and e.uid != want_uid:
            yield Result(NAME, CRITICAL, "pipe-entry-owner", inst.name,
                         f"{where} is owned by {_owner_name(e.uid)}, not by the daemon's user "
                         f"({_owner_name(want_uid)}): clients and queries may reach them",
                         reset.text, BAD, commands=reset.commands)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    dirs: Mapping[str, DirFact] = facts.get("dirs")
    for inst in facts.instances:
        longest = socket_path_bytes(inst.pipe_dir)
        if longest > SUN_PATH_MAX:
            yield Result(NAME, CRITICAL, "pipe-path-too-long", inst.name,
                         f"pipe dir {inst.pipe_dir} is too long for a unix socket path "
                         f"({longest} bytes with '/{LONGEST_ENTRY}', limit {SUN_PATH_MAX})",
                         "use a shorter pipe dir in the config")
        yield from judge_dir(inst, "pipe", dirs.get(inst.pipe_dir), config)
        yield from judge_dir(inst, "log", dirs.get(inst.log_dir), config)
