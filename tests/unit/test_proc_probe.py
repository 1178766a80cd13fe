"""probes/proc: parsing real /proc files, and reading a --root tree."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES
from mps_health.probes import proc
from roottree import add_process


def test_parse_stat_of_captured_daemon() -> None:
    text = (FIXTURES / "proc_fake-daemon" / "stat").read_text()
    comm, state, ppid, start = proc.parse_stat(text)
    assert (comm, state, ppid) == ("nvidia-cuda-mps", "S", 1)
    assert start == 71559


def test_parse_stat_comm_with_spaces_and_parens() -> None:
    line = "42 (a) b (c) S 7 42 42 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 999 0 0"
    assert proc.parse_stat(line) == ("a) b (c", "S", 7, 999)


@pytest.mark.parametrize("bad", ["", "12 cat R", "1 (x) S", "1 (x) S a b c d e f g h i j k l m n o p q r s t"])
def test_parse_stat_rejects_garbage(bad: str) -> None:
    with pytest.raises(proc.ParseError):
        proc.parse_stat(bad)


def test_parse_status_uid() -> None:
    text = (FIXTURES / "proc_fake-daemon" / "status").read_text()
    assert proc.parse_status_uid(text) == 0
    with pytest.raises(proc.ParseError):
        proc.parse_status_uid("Name:\tx\n")


def test_role_from_cmdline_not_comm() -> None:
    assert proc.role_of(("nvidia-cuda-mps-control", "-d")) == "control"
    assert proc.role_of(("/usr/bin/nvidia-cuda-mps-control", "-f")) == "control"
    assert proc.role_of(("nvidia-cuda-mps-control",)) == "client"  # echo CMD | ...
    assert proc.role_of(("/usr/bin/nvidia-cuda-mps-server",)) == "server"
    assert proc.role_of(()) == "unknown"  # a zombie's cmdline is empty


def test_environ_gives_pipe_dir_and_default(tmp_path: Path) -> None:
    add_process(tmp_path, 100, pipe_dir="/tmp/nvidia-mps_0")
    add_process(tmp_path, 101)  # no CUDA_MPS_PIPE_DIRECTORY: the daemon's default
    add_process(tmp_path, 102, state="Z")
    add_process(tmp_path, 103, role="server", pipe_dir="/tmp/nvidia-mps_0", ppid=100)
    (tmp_path / "proc" / "200").mkdir()  # a process that vanished mid-read: ignored
    facts = {p.pid: p for p in proc.read_processes(str(tmp_path / "proc"))}
    assert facts[100].pipe_dir == "/tmp/nvidia-mps_0" and facts[100].role == "control"
    assert facts[101].pipe_dir == "/tmp/nvidia-mps"
    assert facts[102].state == "Z" and facts[102].role == "unknown"
    assert facts[103].role == "server" and facts[103].ppid == 100
    assert 200 not in facts


def test_live_proc_finds_the_daemon_and_no_other_process(site) -> None:
    """The real /proc: a live (fake) control daemon is found with its pipe dir; a plain
    process, and this one, are not listed at all."""
    d = site.start_daemon()
    decoy = subprocess.Popen(["sleep", "30"])
    try:
        found = {p.pid: p for p in proc.read_processes("/proc")}
    finally:
        decoy.kill()
        decoy.wait()
    assert d.pid is not None
    daemon = found[d.pid]
    assert (daemon.role, daemon.pipe_dir, daemon.uid) == ("control", str(d.pipe_dir), 0)
    assert decoy.pid not in found and os.getpid() not in found
    assert {p.role for p in found.values()} <= {"control", "client", "server", "unknown"}


@pytest.mark.parametrize("captured,role", [("proc_h200-daemon", "control"),
                                           ("proc_h200-server", "server")])
def test_real_h200_processes(tmp_path: Path, captured: str, role: str) -> None:
    """/proc files of the real daemon and server, captured on the H200 (tests/gpu)."""
    src = FIXTURES / captured
    d = tmp_path / "proc" / "4242"
    d.mkdir(parents=True)
    for name in ("stat", "status", "cmdline", "comm", "environ"):
        (d / name).write_bytes((src / name).read_bytes())
    [fact] = proc.read_processes(str(tmp_path / "proc"))
    assert fact.role == role and fact.state == "S" and fact.uid == 0
    assert fact.pipe_dir is not None and fact.pipe_dir.startswith("/tmp/mpsh-")


def test_the_runs_own_control_client_is_not_a_daemon(tmp_path: Path) -> None:
    """A control client this run started (its name, comm and environment are a
    daemon's) is left out of the facts; the same process started by anyone else is seen,
    as a client (no -d/-f), never a daemon."""
    import os
    import subprocess

    from mps_health.config.load import from_mapping
    from mps_health.probes.context import Context

    client = tmp_path / "nvidia-cuda-mps-control"  # comm and cmdline[0] as the real client's
    client.symlink_to("/bin/sleep")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path))
    child = subprocess.Popen([str(client), "30"], env=env)
    try:
        seen = exec_seen(child.pid)
        assert seen.role == "client" and seen.pipe_dir == str(tmp_path)
        facts = proc.gather_for(Context(from_mapping({}, None)), ())
        assert child.pid not in [p.pid for p in facts]
    finally:
        child.kill()
        child.wait()


def exec_seen(pid: int) -> proc.ProcessFact:
    """``pid`` as read_processes sees it once its exec has happened (its cmdline is empty
    for a moment around the exec; a loaded machine makes the moment longer)."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = [p for p in proc.read_processes("/proc") if p.pid == pid]
        if seen and seen[0].cmdline:
            return seen[0]
        time.sleep(0.01)
    raise AssertionError(f"{pid} never showed its command line")


def test_a_daemon_whose_parent_is_the_run_is_still_a_daemon(tmp_path: Path) -> None:
    """The run as the first process of a PID namespace (a container's entrypoint, tests
    under unshare --pid) becomes the parent of every daemon, which forks away from its
    starter: only its own control clients are left out, never a daemon."""
    from mps_health.config.load import from_mapping
    from mps_health.probes.context import Context

    daemon = tmp_path / "nvidia-cuda-mps-control"  # comm and cmdline[0] as the real one's
    daemon.symlink_to(os.path.realpath("/usr/bin/python3"))
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path))
    child = subprocess.Popen([str(daemon), "-c", "import time; time.sleep(30)", "-d"],
                             env=env)
    try:
        assert exec_seen(child.pid).role == "control"
        facts = proc.gather_for(Context(from_mapping({}, None)), ())
        assert child.pid in [p.pid for p in facts]
    finally:
        child.kill()
        child.wait()
