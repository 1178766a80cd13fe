"""Which repair each dir fault gets: the directories check's actions, ``remediate dirs``'
plan and a repair that never swaps a dir from under a daemon (``replace=False``)."""

import os
import stat
from pathlib import Path

import pytest
from mps_health.checks import directories
from mps_health.config import load as config_mod
from mps_health.hostio import safedirs
from mps_health.model.facts import DirFact, Instance
from mps_health.remediation import dirs

INST = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
DIRS = "run 'mps-health remediate dirs node'"
RESET = "run 'mps-health remediate reset node'"


@pytest.mark.parametrize("role, kind, trusted, repair", [
    ("pipe", "dir", True, "dirs"),
    ("log", "dir", True, "dirs"),
    ("log", "missing", False, "dirs"),  # a running daemon keeps its open logs
    ("pipe", "missing", False, "reset"),  # the daemon's sockets are gone
    ("pipe", "dir", False, "reset"),  # another user's dir is moved aside, never adopted
    ("log", "dir", False, "reset"),
    ("pipe", "symlink", True, "reset"),
    ("log", "symlink", True, "reset"),
    ("pipe", "file", True, "reset"),
    ("log", "other", True, "reset"),
])
def test_repair_of(role: str, kind: str, trusted: bool, repair: str) -> None:
    assert directories.repair_of(role, kind, trusted) == repair


def _actions(role: str, d: DirFact, **mps: str) -> dict:
    cfg = config_mod.from_mapping({"mps": mps} if mps else {}, None)
    return {r.code: r.action for r in directories.judge_dir(INST, role, d, cfg)}


def test_each_dir_fault_names_the_repair_that_fixes_only_it() -> None:
    pipe, log = INST.pipe_dir, INST.log_dir
    assert _actions("pipe", DirFact(pipe, "dir", 0o700, 0, 0))["pipe-dir-mode"].startswith(DIRS)
    assert _actions("log", DirFact(log, "dir", 0o777, 0, 0))["log-dir-mode"].startswith(DIRS)
    assert _actions("log", DirFact(log, "missing"))["log-dir-missing"].startswith(DIRS)
    assert _actions("pipe", DirFact(pipe, "missing"))["pipe-dir-missing"].startswith(RESET)
    for role, path in (("pipe", pipe), ("log", log)):
        assert _actions(role, DirFact(path, "symlink", 0o777, 0, 0, link_target="/etc"))[
            f"{role}-dir-symlink"].startswith(RESET)
        assert _actions(role, DirFact(path, "file", 0o644, 0, 0))[
            f"{role}-dir-not-dir"].startswith(RESET)
    # Owned by root, the config wanting another trusted user: a chown in place.
    nobody = __import__("pwd").getpwnam("nobody").pw_uid
    found = _actions("pipe", DirFact(pipe, "dir", 0o777, 0, 0), dir_owner="nobody")
    assert found["pipe-dir-owner"].startswith(DIRS)
    # Owned by a stranger: moved aside, never adopted, which the daemon cannot run through.
    found = _actions("pipe", DirFact(pipe, "dir", 0o700, nobody + 1, 0))
    assert found["pipe-dir-owner"].startswith(RESET) and found["pipe-dir-mode"].startswith(RESET)


def _target(path: str, mode: int = 0o777) -> dirs.DirTarget:
    return dirs.DirTarget(path, mode, 0, 0, frozenset({0}), clear=True)


def test_plan_fix_in_place_or_left_to_reset() -> None:
    busy = "control 42 (uid 0)"
    fix = dirs.plan_fix("pipe", DirFact("/p", "dir", 0o700, 0, 0), _target("/p"), "root",
                        busy, "node")
    assert (fix.lines, fix.refused, fix.replace, fix.target.clear) == (
        ("change mode of /p from 0700 to 0777",), "", False, False)
    link = DirFact("/p", "symlink", 0o777, 1001, 1001, link_target="/etc")
    fix = dirs.plan_fix("pipe", link, _target("/p"), "root", busy, "node")
    assert fix.refused == ("pipe dir /p is a symlink to /etc while control 42 (uid 0) uses "
                           "it: its daemon's sockets are gone or in another's hands; run "
                           "'mps-health remediate reset node'")
    fix = dirs.plan_fix("pipe", link, _target("/p"), "root", "", "node")
    assert fix.refused == "" and fix.replace and fix.lines[0].startswith("move /p (a symlink")
    fix = dirs.plan_fix("log", DirFact("/l", "missing"), _target("/l", 0o755), "root", busy,
                        "node")
    assert (fix.lines, fix.refused, fix.replace) == (
        ("create /l mode 0755 owner root",), "", False)
    right = dirs.plan_fix("pipe", DirFact("/p", "dir", 0o777, 0, 0), _target("/p"), "root",
                          busy, "node")
    assert right.lines == () and right.refused == ""


def test_repair_without_replace_never_swaps(tmp_path: Path) -> None:
    """replace=False: a mode set through the fd, a missing dir made, anything else left as
    it is with one line naming it."""
    tree = tmp_path / "t"
    tree.mkdir(mode=0o755)
    (tree / "p").mkdir(mode=0o700)
    done = dirs.repair("/", _target(f"{tree}/p")._replace(clear=False), replace=False)
    assert done == [f"{tree}/p: mode 0700 -> 0777"]
    assert stat.S_IMODE(os.lstat(tree / "p").st_mode) == 0o777
    done = dirs.repair("/", _target(f"{tree}/new", 0o755)._replace(clear=False), replace=False)
    assert done == [f"created {tree}/new mode 0755 owner 0:0"]
    (tree / "elsewhere").mkdir()
    (tree / "l").symlink_to(tree / "elsewhere")
    with pytest.raises(safedirs.UnsafePath) as e:
        dirs.repair("/", _target(f"{tree}/l")._replace(clear=False), replace=False)
    assert str(e.value) == f"{tree}/l is now a symlink: left as it is"
    assert os.readlink(tree / "l") == str(tree / "elsewhere")
    assert sorted(p.name for p in tree.iterdir()) == ["elsewhere", "l", "new", "p"]
