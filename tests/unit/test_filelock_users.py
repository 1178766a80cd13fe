"""mps_health.hostio.filelock and mps_health.hostio.users: the one lock loop and the one user lookup."""

import os
import time
from pathlib import Path

import pytest
from mps_health.hostio.filelock import FileLock, LockBusy, node_lock
from mps_health.hostio.users import User, UserError, by_uid, groups_of, name_of, resolve, uid_of


def test_a_held_lock_is_waited_for_boundedly_and_names_its_holder(tmp_path: Path) -> None:
    held = node_lock(str(tmp_path / "run")).acquire(0, "reset gpu0 (by the test)")
    try:
        t0 = time.monotonic()
        with pytest.raises(LockBusy, match=r"reset gpu0 \(by the test\)"):
            node_lock(str(tmp_path / "run")).acquire(0.2, "another")
        assert time.monotonic() - t0 < 5
        assert not FileLock(held.path).try_acquire("x")
    finally:
        held.release()
    with node_lock(str(tmp_path / "run")).acquire(0, "next") as again:
        assert again.fd is not None


def test_a_link_at_the_lock_path_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").write_text("keep")
    os.symlink(tmp_path / "elsewhere", tmp_path / "run" / "remediate.lock")
    with pytest.raises(OSError):
        node_lock(str(tmp_path / "run")).acquire(0, "x")
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_users_without_a_passwd_entry_are_still_users() -> None:
    assert by_uid(0).name == "root" and name_of(0) == "root"
    assert by_uid(4000123) == User(4000123, 4000123, "4000123", "/")
    assert name_of(4000123) is None
    assert uid_of("root") == 0 and uid_of("4000123") == 4000123 and uid_of("no-such-user") is None
    assert groups_of(User(4000123, 4000123, "4000123")) == (4000123,)


def test_config_user_values() -> None:
    assert resolve("any").uid == 0
    assert resolve("job", 4000123).uid == 4000123
    with pytest.raises(UserError, match="'job' but the job's user is not known"):
        resolve("job")
    with pytest.raises(UserError, match="names user 'no-such-user', who does not exist"):
        resolve("no-such-user", key="mps.dir_owner")
