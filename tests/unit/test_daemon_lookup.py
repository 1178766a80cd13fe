"""processes.candidates/daemons_in/named_daemon: a pipe dir's control daemon is
found in /proc (the configured binary, -d, the daemon's uid, its environ naming the pipe
dir); the pid file is a hint that must agree, never the way to a process.

On a fake /proc tree (tests/helpers/roottree.py): each process's ``exe`` is a link to the binary
it runs, as /proc shows it, so the binary rule is the real one. Pipe dirs are in the
test's tmp dir (the pid file is read there), never /tmp/nvidia-mps.
"""

import os
from pathlib import Path
from typing import Optional

import pytest
from mps_health.hostio.pidfile import PID_FILE, read_pid
from mps_health.remediation import processes
from paths import FAKE_CONTROL, fake_binaries
from roottree import add_process

ROOT_DAEMON, EVIL_DAEMON, EVIL_POSER, ROOT_CLIENT, OTHER_DIR, ZOMBIE, HIDDEN = (
    100, 101, 102, 103, 104, 105, 106)
EVIL = 1001


def _process(tree: Path, pid: int, exe: str, uid: int = 0, pipe: Optional[Path] = None,
             role: str = "control", state: str = "S", environ: bool = True) -> None:
    add_process(tree, pid, uid=uid, pipe_dir=str(pipe) if pipe else None, role=role,
                state=state)
    entry = tree / "proc" / str(pid)
    (entry / "exe").symlink_to(os.path.realpath(exe))
    if not environ:  # as root may not read it: the probe sees no regular file there
        (entry / "environ").unlink()
        (entry / "environ").mkdir()


@pytest.fixture
def node(tmp_path: Path):
    """Pipe dir ``pipe`` served by root's daemon 100, and beside it: a user's genuine
    daemon naming the same dir (101), a user's copy of another program named like a
    daemon (102), root's control client (103), root's daemon of another dir (104), a
    zombie (105) and a root daemon whose environ cannot be read (106)."""
    pipe, other = tmp_path / "pipe", tmp_path / "other"
    pipe.mkdir()
    other.mkdir()
    _process(tmp_path, ROOT_DAEMON, FAKE_CONTROL, pipe=pipe)
    _process(tmp_path, EVIL_DAEMON, FAKE_CONTROL, uid=EVIL, pipe=pipe)
    _process(tmp_path, EVIL_POSER, "/bin/sleep", uid=EVIL, pipe=pipe)
    _process(tmp_path, ROOT_CLIENT, FAKE_CONTROL, pipe=pipe, role="client")
    _process(tmp_path, OTHER_DIR, FAKE_CONTROL, pipe=other)
    _process(tmp_path, ZOMBIE, FAKE_CONTROL, pipe=pipe, state="Z")
    _process(tmp_path, HIDDEN, FAKE_CONTROL, environ=False)
    return str(tmp_path / "proc"), pipe


def _pids(found) -> list:
    return sorted(p.pid for p in found)


def _daemons_of(proc: str, pipe: str, binaries, uid: int) -> tuple:
    """Every daemon of ``uid`` serving ``pipe`` as ``unit stop`` finds them: the /proc
    candidates, the pid file only a hint for one whose environ cannot be read."""
    return processes.daemons_in(processes.candidates(proc, binaries), (pipe,), (uid,),
                                read_pid(pipe))


def _pid_file(pipe: Path, text: Optional[str]) -> None:
    if text is None:
        (pipe / PID_FILE).unlink(missing_ok=True)
    else:
        (pipe / PID_FILE).write_text(text)


def test_candidates_are_every_genuine_live_daemon(node) -> None:
    proc, _ = node
    assert _pids(processes.candidates(proc, fake_binaries())) == [
        ROOT_DAEMON, EVIL_DAEMON, OTHER_DIR, HIDDEN]


@pytest.mark.parametrize("pid_file", [None, "", "garbage", str(EVIL_DAEMON),
                                      str(EVIL_POSER), str(ROOT_CLIENT), str(OTHER_DIR),
                                      str(ZOMBIE), "999999", str(ROOT_DAEMON)])
def test_the_daemon_is_found_whatever_the_pid_file_says(node, pid_file) -> None:
    proc, pipe = node
    _pid_file(pipe, pid_file)
    binaries = fake_binaries()
    assert _pids(_daemons_of(proc, str(pipe), binaries, 0)) == [ROOT_DAEMON]
    named = processes.named_daemon(proc, str(pipe), binaries, 0)
    assert (named.pid if named else None) == (ROOT_DAEMON if pid_file == str(ROOT_DAEMON)
                                              else None)


def test_another_uids_daemon_is_never_the_one_even_when_named(node) -> None:
    proc, pipe = node
    _pid_file(pipe, str(EVIL_DAEMON))
    binaries = fake_binaries()
    assert processes.named_daemon(proc, str(pipe), binaries, 0) is None
    assert _pids(_daemons_of(proc, str(pipe), binaries, EVIL)) == [EVIL_DAEMON]
    assert _daemons_of(proc, str(pipe), binaries, 4242) == ()


def test_a_pid_file_that_disagrees_is_said_and_ignored(node) -> None:
    proc, pipe = node
    daemons = _daemons_of(proc, str(pipe), fake_binaries(), 0)
    line = processes.pid_file_ignored(EVIL_POSER, daemons, (0,))
    assert line.startswith(f"the pid file names {EVIL_POSER}, which is not a control "
                           "daemon of uid 0") and "left alone" in line
    assert processes.pid_file_ignored(ROOT_DAEMON, daemons, (0,)) == ""
    assert processes.pid_file_ignored(None, daemons, (0,)) == ""


def test_a_daemon_whose_environ_cannot_be_read_counts_only_when_the_pid_file_names_it(
        node) -> None:
    proc, pipe = node
    binaries = fake_binaries()
    _pid_file(pipe, str(HIDDEN))
    assert _pids(_daemons_of(proc, str(pipe), binaries, 0)) == [ROOT_DAEMON, HIDDEN]
    hidden = processes.named_daemon(proc, str(pipe), binaries, 0)
    assert hidden is not None and hidden.pid == HIDDEN
    _pid_file(pipe, None)
    assert _pids(_daemons_of(proc, str(pipe), binaries, 0)) == [ROOT_DAEMON]


def test_with_no_daemon_of_the_uid_there_is_none(node) -> None:
    proc, pipe = node
    _pid_file(pipe, str(EVIL_DAEMON))
    empty = pipe.parent / "empty"
    empty.mkdir()
    assert _daemons_of(proc, str(empty), fake_binaries(), 0) == ()
    assert processes.named_daemon(proc, str(empty), fake_binaries(), 0) is None


def test_two_daemons_serving_one_dir_are_both_found_and_the_named_one_agrees(
        tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    for pid in (300, 200):
        _process(tmp_path, pid, FAKE_CONTROL, pipe=pipe)
    proc = str(tmp_path / "proc")
    assert _pids(_daemons_of(proc, str(pipe), fake_binaries(), 0)) == [200, 300]
    _pid_file(pipe, "300")
    named = processes.named_daemon(proc, str(pipe), fake_binaries(), 0)
    assert named is not None and named.pid == 300


def test_reset_lookup_keeps_the_uid_rule_and_servers_by_environ(node) -> None:
    """of_pipe_dirs (remediate reset, orphans): daemons of the given uid only; None (the
    config's ``mps.daemon_user: any``) takes every uid, as before."""
    from mps_health.probes.proc import read_processes

    proc, pipe = node
    found = read_processes(proc, fake_binaries())
    daemons, _ = processes.of_pipe_dirs(found, (str(pipe),), {0})
    assert _pids(daemons) == [ROOT_DAEMON]
    daemons, _ = processes.of_pipe_dirs(found, (str(pipe),), None)
    assert _pids(daemons) == [ROOT_DAEMON, EVIL_DAEMON]
