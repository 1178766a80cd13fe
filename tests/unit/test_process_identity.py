"""mps_health.probes.process_identity: a daemon, a client, a server, or a process only named so.

Real processes in the real /proc: copies of coreutils programs at "configured" paths
stand in for the MPS binaries (a copy is a file of its own, as the real binary is), so
what is judged is the kernel's view of which file a process runs.
"""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest
from hostile import exec_done
from mps_health.config import load as config
from mps_health.probes.proc import read_process
from mps_health.probes.process_identity import (
    binaries_for,
    binaries_of,
    is_daemon,
    is_impostor,
    is_server,
    locate,
    not_found,
    role_of,
    runs_binary,
)
from mps_health.remediation import processes


def test_the_role_comes_from_the_command_line() -> None:
    # As seen on the H200: the daemon keeps its -d; a client has no flag; a server gets ""
    assert role_of(("/usr/local/nvidia/bin/nvidia-cuda-mps-control", "-d")) == "control"
    assert role_of(("nvidia-cuda-mps-control", "-f")) == "control"
    assert role_of(("nvidia-cuda-mps-control",)) == "client"
    assert role_of(("nvidia-cuda-mps-control", "-dx")) == "client"  # not the flag
    assert role_of(("/usr/bin/nvidia-cuda-mps-server", "")) == "server"
    assert role_of(("nvidia-cuda-mps-serverx",)) == "unknown"
    assert role_of(()) == "unknown"


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """A "driver" dir: nvidia-cuda-mps-control and -server as files of their own."""
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy("/usr/bin/tail", d / "nvidia-cuda-mps-control")  # tail -f: runs on
    shutil.copy("/usr/bin/sleep", d / "nvidia-cuda-mps-server")
    return d


@pytest.fixture
def started() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def start(procs: List[subprocess.Popen], argv: List[str], executable: str) -> int:
    p = subprocess.Popen(argv, executable=executable, env={"CUDA_MPS_PIPE_DIRECTORY": "/x"})
    procs.append(p)
    exec_done(p.pid)  # its exe is set before its command line: wait for the latter
    return p.pid


def test_daemon_client_server_and_impostors(bindir: Path, tmp_path: Path, started) -> None:
    control, server = str(bindir / "nvidia-cuda-mps-control"), str(bindir / "nvidia-cuda-mps-server")
    binaries = binaries_of(control)  # the server: the one beside the control binary
    assert [b.path for b in binaries.server] == [os.path.realpath(server)]
    daemon = start(started, [control, "-f", "/dev/null"], control)
    client = start(started, [control, "-F", "/dev/null"], control)  # no -d/-f: a client
    real_server = start(started, [server, "60"], server)
    # A user's copy under the same names (argv0 and comm as MPS's), and a renamed argv0.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.copy("/usr/bin/tail", theirs / "nvidia-cuda-mps-control")
    shutil.copy("/usr/bin/sleep", theirs / "nvidia-cuda-mps-server")
    fake_daemon = start(started, [str(theirs / "nvidia-cuda-mps-control"), "-f", "/dev/null"],
                        str(theirs / "nvidia-cuda-mps-control"))
    fake_server = start(started, [str(theirs / "nvidia-cuda-mps-server"), "60"],
                        str(theirs / "nvidia-cuda-mps-server"))
    named = start(started, ["nvidia-cuda-mps-server", "60"], "/usr/bin/sleep")  # exec -a
    facts = {pid: read_process("/proc", pid, binaries)
             for pid in (daemon, client, real_server, fake_daemon, fake_server)}
    assert read_process("/proc", named, binaries) is None  # comm "sleep": no candidate
    assert is_daemon(facts[daemon]) and facts[daemon].genuine is True
    assert facts[client].role == "client" and facts[client].genuine is True
    assert not is_daemon(facts[client])
    assert is_server(facts[real_server]) and facts[real_server].genuine is True
    for pid in (fake_daemon, fake_server):
        assert facts[pid].genuine is False and is_impostor(facts[pid])
        assert not is_daemon(facts[pid]) and not is_server(facts[pid])


def test_an_impostor_is_never_signalled(bindir: Path, tmp_path: Path, started) -> None:
    theirs = tmp_path / "nvidia-cuda-mps-server"
    shutil.copy("/usr/bin/sleep", theirs)
    pid = start(started, [str(theirs), "60"], str(theirs))
    fact = read_process("/proc", pid, binaries_of(str(bindir / "nvidia-cuda-mps-control")))
    assert fact is not None and fact.role == "server" and fact.genuine is False
    assert processes.end_all("/proc", [fact], 0.5)[0].outcome == "refused"
    assert started[0].poll() is None


def test_a_binary_replaced_on_disk_no_longer_matches(bindir: Path, started) -> None:
    server = bindir / "nvidia-cuda-mps-server"
    binaries = binaries_of(str(bindir / "nvidia-cuda-mps-control"))
    pid = start(started, [str(server), "60"], str(server))
    assert runs_binary("/proc", pid, binaries.server) is True
    new = bindir / "new"
    shutil.copy("/usr/bin/sleep", new)
    new.rename(server)  # an update: the running process keeps the old, deleted file
    assert os.readlink(f"/proc/{pid}/exe").endswith(" (deleted)")
    assert runs_binary("/proc", pid, binaries_of(str(bindir / "nvidia-cuda-mps-control")
                                                 ).server) is False


def test_no_binary_found_means_unknown_not_impostor(tmp_path: Path, started) -> None:
    missing = binaries_of(str(tmp_path / "nowhere" / "nvidia-cuda-mps-control"))
    assert missing.control == () and missing.server == ()
    pid = start(started, ["nvidia-cuda-mps-server", "60"], "/usr/bin/sleep")
    assert runs_binary("/proc", pid, missing.server) is None


def test_a_configured_server_and_names_found_in_the_binary_dirs(bindir: Path,
                                                                tmp_path: Path) -> None:
    other = tmp_path / "srv"
    other.mkdir()
    shutil.copy("/usr/bin/sleep", other / "nvidia-cuda-mps-server")
    b = binaries_of("nvidia-cuda-mps-control", str(other / "nvidia-cuda-mps-server"),
                    [str(bindir)])
    assert [x.path for x in b.control] == [str(bindir / "nvidia-cuda-mps-control")]
    assert [x.path for x in b.server] == [str(other / "nvidia-cuda-mps-server")]
    assert binaries_of("relative/nvidia-cuda-mps-control").control == ()


def test_the_binaries_are_found_in_the_binary_dirs_never_on_path(
        bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty, unrunnable = tmp_path / "empty", tmp_path / "unrunnable"
    empty.mkdir()
    unrunnable.mkdir()
    (unrunnable / "nvidia-cuda-mps-control").write_text("#!/bin/sh\n")  # not executable
    monkeypatch.setenv("PATH", str(bindir))  # the caller's PATH: never looked at
    cfg = config.from_mapping({"mps": {"binary_dirs": [str(empty), str(unrunnable)]}}, "c")
    assert locate(cfg) is None
    assert not_found(cfg) == (f"nvidia-cuda-mps-control: command not found in {empty}, "
                              f"{unrunnable}")
    cfg = config.from_mapping({"mps": {"binary_dirs": [str(unrunnable), str(bindir)]}}, "c")
    assert locate(cfg) == str(bindir / "nvidia-cuda-mps-control")  # the first that runs
    assert [b.path for b in binaries_for(cfg).control] == [str(bindir / "nvidia-cuda-mps-control")]
    # commands names a path: that file alone, wherever the dirs are
    named = config.from_mapping({"commands": {"nvidia-cuda-mps-control": str(
        unrunnable / "nvidia-cuda-mps-control")}, "mps": {"binary_dirs": [str(bindir)]}}, "c")
    assert locate(named) is None
    assert not_found(named) == f"{unrunnable}/nvidia-cuda-mps-control: command not found"
    assert config.Config().mps.binary_dirs[:6] == tuple(
        ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    assert {"/usr/local/nvidia/bin", "/usr/local/cuda/bin"} <= set(config.Config().mps.binary_dirs)


def test_a_server_in_the_binary_dirs_counts_as_debian_puts_it(bindir: Path,
                                                              tmp_path: Path) -> None:
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    shutil.copy("/usr/bin/sleep", sbin / "nvidia-cuda-mps-server")
    (bindir / "nvidia-cuda-mps-server").unlink()  # Debian: control in /usr/bin only
    b = binaries_of("nvidia-cuda-mps-control", None, [str(bindir), str(sbin)])
    assert [x.path for x in b.server] == [str(sbin / "nvidia-cuda-mps-server")]
    assert binaries_of("nvidia-cuda-mps-control", None, [str(sbin)]).server == ()  # no control
