"""mps_health.hostio.jobrecords: the Prolog's record of each job's uid and dirs.

Bounded, written atomically, read only when root's (or ours) and no link; ``ours`` is
the one rule that makes a dir an orphan of ours. Runs as root (chown to another user).
"""

import json
import os
import time
from pathlib import Path

import pytest
from mps_health.hostio import jobrecords
from mps_health.hostio.jobrecords import JobRecord, add, drop, load, ours

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")
EVIL = 1001


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_nothing_recorded_yet_is_no_error(state: Path) -> None:
    assert load(str(state)) == ((), "")


def test_add_then_drop(state: Path) -> None:
    assert add(str(state), "42", 1002, ["/tmp/nvidia-log_job42", "/tmp/nvidia-mps_job42/"]) == ""
    (r,), error = load(str(state))
    assert error == "" and (r.job_id, r.uid) == ("42", 1002)
    assert r.dirs == ("/tmp/nvidia-log_job42", "/tmp/nvidia-mps_job42")  # normalised
    st = os.lstat(state / "jobs.json")
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
    assert [p.name for p in state.iterdir() if ".tmp-" in p.name] == []  # renamed into place
    # A second GPU's dirs join the job's record.
    assert add(str(state), "42", 1002, ["/tmp/nvidia-mps_job42_1"]) == ""
    (r,), _ = load(str(state))
    assert r.dirs[-1] == "/tmp/nvidia-mps_job42_1" and len(r.dirs) == 3
    # A dir the Epilog could not remove keeps the record, with that dir alone.
    assert drop(str(state), "42", ["/tmp/nvidia-mps_job42"]) == ""
    (r,), _ = load(str(state))
    assert r.dirs == ("/tmp/nvidia-mps_job42",)
    assert drop(str(state), "42") == ""
    assert load(str(state)) == ((), "")


def test_a_record_of_another_uid_is_replaced_not_merged(state: Path) -> None:
    add(str(state), "42", 1002, ["/tmp/a"])
    add(str(state), "42", 1003, ["/tmp/b"])
    (r,), _ = load(str(state))
    assert (r.uid, r.dirs) == (1003, ("/tmp/b",))


def test_ours_is_the_recorded_dir_of_the_recorded_uid_or_root() -> None:
    r = JobRecord("42", 1002, ("/tmp/nvidia-mps_job42",), 0.0)
    assert ours(r, "/tmp/nvidia-mps_job42", 1002)
    assert ours(r, "/tmp/nvidia-mps_job42/", 0)
    assert not ours(r, "/tmp/nvidia-mps_job42", EVIL)  # someone else's dir at the name
    assert not ours(r, "/tmp/nvidia-mps_job43", 1002)  # a name the Prolog did not make
    assert not ours(None, "/tmp/nvidia-mps_job42", 1002)  # no record: a name is not enough


def test_a_link_at_the_file_is_not_followed(state: Path, tmp_path: Path) -> None:
    add(str(state), "1", 1002, ["/tmp/a"])
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps([{"job_id": "9", "uid": 0, "dirs": ["/etc"], "at": 1.0}]))
    os.unlink(state / "jobs.json")
    os.symlink(planted, state / "jobs.json")
    records, error = load(str(state))
    assert records == () and "job records not read" in error
    # Writing replaces the link itself; the file it pointed at is untouched.
    assert "written afresh" in add(str(state), "2", 1002, ["/tmp/b"])
    assert not os.path.islink(state / "jobs.json")
    assert json.loads(planted.read_text())[0]["job_id"] == "9"
    assert [r.job_id for r in load(str(state))[0]] == ["2"]


@pytest.mark.parametrize("uid,mode", [(EVIL, 0o644), (0, 0o666), (0, 0o664)])
def test_a_file_anyone_else_could_write_is_ignored(state: Path, uid: int, mode: int) -> None:
    add(str(state), "1", 1002, ["/tmp/a"])
    os.chown(state / "jobs.json", uid, -1)
    os.chmod(state / "jobs.json", mode)
    records, error = load(str(state))
    assert records == ()
    assert f"is owned by uid {uid} with mode {mode:04o}" in error


def test_a_state_dir_others_can_write_is_refused(state: Path) -> None:
    add(str(state), "1", 1002, ["/tmp/a"])
    os.chmod(state, 0o777)
    records, error = load(str(state))
    assert records == () and "writable by others" in error


def test_damaged_oversized_and_odd_files(state: Path, monkeypatch) -> None:
    state.mkdir()
    (state / "jobs.json").write_text("[{")
    records, error = load(str(state))
    assert records == () and "is damaged" in error
    os.unlink(state / "jobs.json")
    os.mkfifo(state / "jobs.json")  # would block a plain open: refused at once
    records, error = load(str(state))
    assert records == () and "job records not read" in error
    os.unlink(state / "jobs.json")
    monkeypatch.setattr(jobrecords, "MAX_BYTES", 100)
    (state / "jobs.json").write_text("[" + " " * 200 + "]")
    records, error = load(str(state))
    assert records == () and "larger than 100 bytes" in error


def test_invalid_records_are_dropped(state: Path) -> None:
    state.mkdir()
    now = time.time()
    good = {"job_id": "7", "uid": 1002, "dirs": ["/tmp/a"], "at": now}
    bad = [{"job_id": "7; rm", "uid": 1, "dirs": ["/tmp/x"], "at": now},
           {"job_id": "8", "uid": 1, "dirs": ["relative"], "at": now},
           {"job_id": "9", "uid": 1, "dirs": [], "at": now},
           {"job_id": "10", "uid": -1, "dirs": ["/tmp/y"], "at": now},
           {"job_id": "11", "uid": 1, "dirs": ["/tmp/d"] * 65, "at": now}]
    (state / "jobs.json").write_text(json.dumps([good, *bad]))
    records, error = load(str(state))
    assert error == "" and [r.job_id for r in records] == ["7"]


def test_the_file_is_bounded(state: Path, monkeypatch) -> None:
    monkeypatch.setattr(jobrecords, "MAX_RECORDS", 5)
    for job in range(8):
        assert add(str(state), str(job), 1002, [f"/nonexistent/job{job}"]) == ""
    assert [r.job_id for r in load(str(state))[0]] == ["3", "4", "5", "6", "7"]


def test_records_whose_dirs_are_all_gone_are_pruned(state: Path, tmp_path: Path) -> None:
    kept = tmp_path / "still-there"
    kept.mkdir()
    add(str(state), "1", 1002, ["/nonexistent/gone"])
    add(str(state), "2", 1002, [str(kept)])
    add(str(state), "3", 1002, ["/nonexistent/fresh"])
    # Back-date the first two: a fresh record without dirs may be a Prolog at work.
    data = json.loads((state / "jobs.json").read_text())
    for r in data:
        if r["job_id"] in ("1", "2"):
            r["at"] -= 3600
    (state / "jobs.json").write_text(json.dumps(data))
    add(str(state), "4", 1002, ["/nonexistent/new"])
    assert sorted(r.job_id for r in load(str(state))[0]) == ["2", "3", "4"]
