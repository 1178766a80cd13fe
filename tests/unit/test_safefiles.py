"""mps_health.hostio.safefiles and the pid file: what a user plants in a shared dir is never
followed, never blocks a read, and a pid file never gets an unrelated process signalled.

Runs as root, as mps-health does; the planted entries belong to the unprivileged test
user where ownership matters.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mps_health.hostio import pidfile
from mps_health.hostio.safedirs import UnsafePath
from mps_health.hostio.safefiles import read_small, write_atomic
from mps_health.remediation import processes
from paths import fake_binaries
from slurmcluster import ensure_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (planted as a user)")


@pytest.fixture(scope="module")
def user():
    return ensure_user()


@pytest.fixture
def tmp_path():  # the user must reach it: not pytest's 0700 tree
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mpsh-files-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    p = tmp_path / "shared"
    p.mkdir()
    p.chmod(0o1777)  # like /tmp
    return p


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("root's\n")
    v.chmod(0o600)
    return v


def as_user(user, *argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                    "--clear-groups", *argv], check=True, timeout=30)


def test_a_link_at_the_target_is_replaced_not_followed(shared: Path, victim: Path,
                                                        user) -> None:
    as_user(user, "ln", "-s", str(victim), str(shared / "node.json"))
    write_atomic(str(shared / "node.json"), b"{}\n")
    assert not (shared / "node.json").is_symlink()
    assert (shared / "node.json").read_text() == "{}\n"
    assert victim.read_text() == "root's\n" and os.stat(victim).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in shared.iterdir()) == ["node.json"]  # no temp left


def test_a_fifo_at_the_target_is_replaced(shared: Path, user) -> None:
    as_user(user, "mkfifo", str(shared / "out.prom"))
    write_atomic(str(shared / "out.prom"), b"x 1\n", 0o644)
    assert (shared / "out.prom").read_text() == "x 1\n"
    assert os.stat(shared / "out.prom").st_mode & 0o777 == 0o644


def test_the_parent_is_not_reached_through_a_users_link(shared: Path, tmp_path: Path,
                                                         user) -> None:
    real = tmp_path / "real"
    real.mkdir()
    as_user(user, "ln", "-s", str(real), str(shared / "via"))
    with pytest.raises(UnsafePath, match="a symlink owned by uid"):
        write_atomic(str(shared / "via" / "state.json"), b"{}")
    assert list(real.iterdir()) == []


def test_read_small_refuses_links_fifos_and_large_files(shared: Path, victim: Path,
                                                        user) -> None:
    as_user(user, "ln", "-s", str(victim), str(shared / "link"))
    as_user(user, "mkfifo", str(shared / "fifo"))
    (shared / "big").write_bytes(b"x" * 100)
    with pytest.raises(OSError):
        read_small(str(shared / "link"))
    t0 = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        read_small(str(shared / "fifo"))
    assert time.monotonic() - t0 < 5  # it returned: a FIFO never blocks the read
    with pytest.raises(OSError, match="larger than 99 bytes"):
        read_small(str(shared / "big"), 99)
    assert read_small(str(shared / "big"), 100) == b"x" * 100
    assert read_small(str(shared / "missing")) is None


def test_a_fifo_as_pid_file_does_not_hang_and_names_nobody(shared: Path, user) -> None:
    as_user(user, "mkfifo", str(shared / pidfile.PID_FILE))
    assert pidfile.read_pid(str(shared)) is None
    assert processes.named_daemon("/proc", str(shared), fake_binaries(), os.geteuid()) is None


def test_a_pid_file_naming_an_unrelated_process_names_no_daemon(shared: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (shared / pidfile.PID_FILE).write_text(f"{sleeper.pid}\n")
        assert pidfile.read_pid(str(shared)) == sleeper.pid
        assert processes.named_daemon("/proc", str(shared), fake_binaries(), os.geteuid()) is None  # not a control daemon
    finally:
        sleeper.kill()
        sleeper.wait()


def test_unit_stop_with_a_fifo_as_pid_file_returns(shared: Path, user) -> None:
    as_user(user, "mkfifo", str(shared / pidfile.PID_FILE))
    r = subprocess.run([sys.executable, "-m", "mps_health.cli.main", "unit", "stop",
                        "--pipe-dir", str(shared), "--timeout", "2"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "no live control daemon" in r.stdout
