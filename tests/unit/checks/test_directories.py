"""The directories check on made dir facts: each fault of a pipe or log dir (missing,
unreadable, a link, not a dir, mode, owner, a parent others cannot traverse), the pipe
dir's entries judged by name, kind and owner, and a pipe path too long for a socket."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from mps_health.checks import directories
from mps_health.model.facts import DirFact, EntryFact, Instance, ParentFact
from mps_health.model.results import CRITICAL, OK, WARNING, Result

from .made import NODE, codes, dirs_of, pipe_dir, run

EVIL = 1001  # mpshevil
RESET = "'mps-health remediate reset node' (dry run first: --dry-run)"
DIRS = "'mps-health remediate dirs node' (dry run first: --dry-run)"


def judge(cfg: Optional[Dict[str, Any]] = None, inst: Instance = NODE,
          **by_path: DirFact) -> List[Result]:
    return run(directories, {"dirs": dirs_of(inst, **by_path)}, (inst,), cfg)


def pipe(**kw: Any) -> Dict[str, DirFact]:
    return {NODE.pipe_dir: pipe_dir(NODE.pipe_dir, **kw)}


def log(**kw: Any) -> Dict[str, DirFact]:
    return {NODE.log_dir: pipe_dir(NODE.log_dir, **{"mode": 0o755, **kw})}


def test_healthy_dirs_are_ok() -> None:
    found = judge()
    assert codes(found) == [("node", OK, "ok"), ("node", OK, "ok")]
    assert found[0].message == "pipe dir /tmp/nvidia-mps is a directory, mode 0777, owner root"
    assert dict(found[1].values) == {"dir_ok": 1.0}


@pytest.mark.parametrize("role, kind, state, code, wording, action", [
    ("pipe", "missing", CRITICAL, "pipe-dir-missing", "does not exist", RESET),
    ("log", "missing", WARNING, "log-dir-missing", "does not exist", DIRS),
    ("pipe", "error", WARNING, "pipe-dir-unreadable", ": Permission denied", "as root"),
    ("log", "error", WARNING, "log-dir-unreadable", ": Permission denied", "as root"),
    ("pipe", "symlink", CRITICAL, "pipe-dir-symlink", "is a symlink to /home/evil", RESET),
    ("log", "symlink", CRITICAL, "log-dir-symlink", "is a symlink to /home/evil", RESET),
    ("pipe", "file", CRITICAL, "pipe-dir-not-dir", "is a file, not a directory", RESET),
    ("log", "other", CRITICAL, "log-dir-not-dir", "is a other, not a directory", RESET),
])
def test_a_dir_that_is_no_dir(role: str, kind: str, state: int, code: str, wording: str,
                              action: str) -> None:
    path = NODE.pipe_dir if role == "pipe" else NODE.log_dir
    made = DirFact(path, kind, uid=EVIL, link_target="/home/evil", error="Permission denied")
    found = [r for r in judge(**{path: made}) if r.state != OK]
    assert [(r.state, r.code) for r in found] == [(state, code)]
    said = f"{role} dir {path}{wording}" if kind == "error" else f"{role} dir {path} {wording}"
    assert said in found[0].message
    assert action in found[0].action


def test_a_dir_absent_from_the_facts_is_missing() -> None:
    found = run(directories, {"dirs": {}}, (NODE,))
    assert [r.code for r in found] == ["pipe-dir-missing", "log-dir-missing"]


def test_pipe_dir_mode() -> None:
    (r, _) = judge(**pipe(mode=0o755))
    assert (r.state, r.code) == (CRITICAL, "pipe-dir-mode")
    assert "has mode 0755, expected 0777: other users' clients cannot connect" in r.message
    assert DIRS in r.action  # root's dir: its mode set in place


@pytest.mark.parametrize("mode, why", [
    (0o777, "other users can create entries in it"),
    (0o555, "the daemon's user cannot write its logs there"),
])
def test_log_dir_mode(mode: int, why: str) -> None:
    (_, r) = judge(**log(mode=mode))
    assert (r.state, r.code) == (WARNING, "log-dir-mode")
    assert f"has mode {mode:04o}, expected 0755 (mps.log_dir_mode): {why}" in r.message
    assert DIRS in r.action


@pytest.mark.parametrize("role, code", [("pipe", "pipe-dir-owner"), ("log", "log-dir-owner")])
def test_a_dir_of_another_owner(role: str, code: str) -> None:
    mode = 0o777 if role == "pipe" else 0o755
    path = NODE.pipe_dir if role == "pipe" else NODE.log_dir
    made = {path: DirFact(path, "dir", mode, EVIL, EVIL, "mpshevil")}
    (r,) = [r for r in judge(**made) if r.state != OK]
    assert (r.state, r.code) == (WARNING, code)
    assert f"{role} dir {path} is owned by mpshevil, expected root" in r.message
    assert RESET in r.action  # another user's dir is never adopted


def test_a_dir_owned_by_the_configured_user_is_repaired_in_place() -> None:
    found = judge({"mps": {"dir_owner": "mpshvictim"}}, **pipe(mode=0o700, uid=1002))
    assert [r.code for r in found if r.state != OK] == ["pipe-dir-mode"]
    assert DIRS in found[0].action


@pytest.mark.parametrize("role, state, code, why", [
    ("pipe", CRITICAL, "pipe-dir-parent", "every client of another user than its owner fails"),
    ("log", WARNING, "log-dir-parent", "users other than its owner cannot reach"),
])
def test_a_parent_others_cannot_traverse(role: str, state: int, code: str, why: str) -> None:
    path = NODE.pipe_dir if role == "pipe" else NODE.log_dir
    blocked = (ParentFact("/srv/mps", 0o750, 0),)
    made = {path: pipe_dir(path, mode=0o777 if role == "pipe" else 0o755, blocked=blocked)}
    (r,) = [r for r in judge(**made) if r.state != OK]
    assert (r.state, r.code) == (state, code)
    assert f"{role} dir {path}: its parent /srv/mps has mode 0750 (owner root (uid 0))" \
        in r.message and why in r.message
    assert "chmod o+x /srv/mps" in r.action and "leaves it alone" in r.action
    # The dir itself is right, but nothing says OK for it while the parent blocks.
    assert [x.code for x in judge(**made)].count("ok") == 1


def entries(*made: EntryFact) -> Dict[str, DirFact]:
    return pipe(entries=made)


def test_the_daemons_own_entries_are_ok() -> None:
    own = entries(EntryFact("control", "socket", 0o777, 0), EntryFact("log", "fifo", 0o600, 0),
                  EntryFact("control_lock", "file", 0o600, 0),
                  EntryFact("nvidia-cuda-mps-control.pid", "file", 0o644, 0))
    assert [r.code for r in judge(**own)] == ["ok", "ok"]


def test_an_own_name_of_the_wrong_kind_is_bad() -> None:
    (r, _) = judge(**entries(EntryFact("control", "symlink", 0o777, EVIL)))
    assert (r.state, r.code) == (CRITICAL, "pipe-entry-bad")
    assert "/tmp/nvidia-mps/control is a symlink owned by mpshevil (uid 1001), expected a " \
        "socket" in r.message and RESET in r.action


def test_an_own_name_of_another_owner() -> None:
    (r, _) = judge(**entries(EntryFact("control", "socket", 0o777, EVIL)))
    assert (r.state, r.code) == (CRITICAL, "pipe-entry-owner")
    assert "/tmp/nvidia-mps/control is owned by mpshevil (uid 1001), not by the daemon's " \
        "user (root (uid 0)): clients and queries may reach them" in r.message


def test_any_other_entry_is_foreign_a_warning_naming_its_owner() -> None:
    (r, _) = judge(**entries(EntryFact("junk", "file", 0o644, EVIL)))
    assert (r.state, r.code) == (WARNING, "pipe-entry-foreign")
    assert "/tmp/nvidia-mps/junk (file) belongs to mpshevil (uid 1001), not to MPS" in r.message
    assert dict(r.values) == {"foreign_entries": 1.0}


def test_a_pipe_path_too_long_for_a_socket() -> None:
    long = Instance("node", "node", "/tmp/" + "p" * 90, "/var/log/nvidia-mps")
    found = judge(inst=long)
    assert codes(found)[0] == ("node", CRITICAL, "pipe-path-too-long")
    assert "(115 bytes with '/control_privileged', limit 108)" in found[0].message
    assert "shorter pipe dir" in found[0].action
