"""The logs probe's owner rule: only the daemon's user's regular files are read; links and
other users' entries in a log dir are WARNINGs naming the uid, never read, never CRITICAL.
And the directories check's log-dir-mode: a WARNING fixed in place by `remediate dirs`.

Runs as root (chown to another user), as the health check does.
"""

import os
import time
from pathlib import Path

import pytest
from mps_health.checks import directories
from mps_health.checks import logs as check
from mps_health.config import load as config_mod
from mps_health.model.facts import DirFact, Facts, Instance
from mps_health.model.facts_deep import LogsFacts
from mps_health.model.results import CRITICAL, WARNING
from mps_health.probes import logs as probe
from slurmcluster import ensure_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")

FATAL = "[{} Server   510] fatal exception\n"


@pytest.fixture(scope="module")
def user():
    return ensure_user()


def fatal_lines() -> str:
    return FATAL.format(time.strftime("%Y-%m-%d %H:%M:%S.000"))


def test_a_file_of_another_owner_is_not_read(tmp_path: Path, user) -> None:
    (tmp_path / "control.log").write_text(fatal_lines())
    os.chown(tmp_path / "control.log", user.pw_uid, user.pw_gid)
    with pytest.raises(probe.NotTheDaemons) as e:
        probe.read_file(str(tmp_path), "control.log", None, 1 << 20, {0})
    assert e.value.uid == user.pw_uid and e.value.what == f"a file owned by uid {user.pw_uid}"
    chunks, _, _ = probe.read_file(str(tmp_path), "control.log", None, 1 << 20,
                                   {user.pw_uid})
    assert chunks[0][1] == (tmp_path / "control.log").read_text()


def test_a_hard_link_is_not_the_daemons_log(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text(fatal_lines())
    os.link(tmp_path / "elsewhere", tmp_path / "control.log")
    with pytest.raises(probe.NotTheDaemons) as e:
        probe.read_file(str(tmp_path), "control.log", None, 1 << 20, {0})
    assert "with 2 links" in e.value.what


def test_log_owners_follow_the_daemon_user() -> None:
    node = config_mod.from_mapping({}, None)
    assert probe.log_owners(node, 1234) == {0}
    per_job = config_mod.from_mapping({"mps": {"layout": "per-job"}}, None)
    assert probe.log_owners(per_job, 1234) == {1234}  # the job's user owns their log dir
    anyone = config_mod.from_mapping({"mps": {"daemon_user": "any"}}, None)
    assert probe.log_owners(anyone, 1234) == {0, 1234}


def gathered(tmp_path: Path, log: Path) -> LogsFacts:
    from mps_health.probes.context import Context

    cfg = config_mod.from_mapping({"state_dir": str(tmp_path / "state"),
                                   "mps": {"log_dir": str(log)}}, None)
    inst = Instance("node", "node", "/tmp/nvidia-mps", str(log))
    return probe.gather(Context(cfg, "/"), (inst,))


def results(lf: LogsFacts, log: Path) -> list:
    cfg = config_mod.from_mapping({"mps": {"log_dir": str(log)}}, None)
    inst = Instance("node", "node", "/tmp/nvidia-mps", str(log))
    return list(check.check(Facts("n", lf.taken_at, "/", (inst,), {"logs": lf}, {}, {}), cfg))


def judged(lf: LogsFacts, log: Path) -> dict:
    return {r.code: r for r in results(lf, log)}


def test_planted_entries_are_warnings_naming_the_uid_and_never_read(tmp_path: Path,
                                                                   user) -> None:
    log = tmp_path / "log"
    log.mkdir()
    (log / "control.log").write_text(fatal_lines())
    os.chown(log / "control.log", user.pw_uid, user.pw_gid)  # forged
    os.mkfifo(log / "server.log")  # root's, but no regular file: never opened
    (log / "notes").symlink_to("/etc/shadow")
    os.lchown(log / "notes", user.pw_uid, user.pw_gid)
    (log / "control.log.1").write_text("[x] old, root's\n")  # a rotation: the daemon's
    lf = gathered(tmp_path, log)
    assert lf.findings == ()
    found = judged(lf, log)
    assert "log-fatal" not in found and "logs-unreadable" not in found
    assert found["log-file-bad"].state == WARNING
    messages = sorted(r.message for r in results(lf, log) if r.code == "log-file-bad")
    assert messages == [f"{log}/control.log is a file owned by uid {user.pw_uid}, not the "
                        "daemon's own log: not read",
                        f"{log}/server.log is a fifo owned by uid 0, not the daemon's own "
                        "log: not read"]
    foreign = found["log-entry-foreign"]
    assert foreign.state == WARNING and f"uid {user.pw_uid}" in foreign.message
    assert f"{log}/notes (a symlink owned by uid {user.pw_uid})" in foreign.message
    assert "control.log.1" not in foreign.message
    assert all(r.state != CRITICAL for r in found.values())


def test_the_daemons_own_log_is_still_read(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    (log / "control.log").write_text(fatal_lines())
    found = judged(gathered(tmp_path, log), log)
    assert found["log-fatal"].state == WARNING
    assert "log-file-bad" not in found and "log-entry-foreign" not in found


def test_a_huge_log_dir_costs_a_bounded_scan(tmp_path: Path, user) -> None:
    log = tmp_path / "log"
    log.mkdir()
    for i in range(probe.MAX_ENTRIES + 50):
        (log / f"x{i}").write_text("")
        os.chown(log / f"x{i}", user.pw_uid, user.pw_gid)
    fd = os.open(log, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries, more = probe.scan(fd)
    finally:
        os.close(fd)
    assert len(entries) == probe.MAX_ENTRIES and more
    found = judged(gathered(tmp_path, log), log)
    message = found["log-entry-foreign"].message
    assert message.startswith(f"{probe.MAX_ENTRIES} entries") and "and " in message


def test_log_dir_mode_is_a_warning_whose_action_is_a_dirs_repair() -> None:
    cfg = config_mod.from_mapping({}, None)
    inst = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")

    def result(mode: int):
        d = DirFact("/var/log/nvidia-mps", "dir", mode, 0, 0, "root")
        return [r for r in directories.judge_dir(inst, "log", d, cfg)]

    (r,) = result(0o777)
    # A chmod through the dir's fd, the daemon left running: 'remediate dirs'.
    assert (r.state, r.code, r.action) == (WARNING, "log-dir-mode", "run 'mps-health "
                                           "remediate dirs node' (dry run first: --dry-run); "
                                           "the daemon and its clients keep running")
    assert "other users can create entries" in r.message
    (r,) = result(0o555)
    assert r.code == "log-dir-mode" and "cannot write its logs" in r.message
    assert [r.code for r in result(0o755)] == ["ok"]
    per_job = config_mod.from_mapping({"mps": {"layout": "per-job"}}, None)
    assert per_job.mps.log_dir_mode == 0o700 and per_job.mps.dir_mode == 0o777
    with pytest.raises(config_mod.ConfigError, match="log_dir_mode"):
        config_mod.from_mapping({"mps": {"log_dir_mode": "0555"}}, None)


def test_a_missing_log_dir_is_no_unreadable_log(tmp_path: Path) -> None:
    log = tmp_path / "gone"
    lf = gathered(tmp_path, log)
    assert [f.status for f in lf.files] == ["missing", "missing"]
    assert "logs-unreadable" not in judged(lf, log)  # the directories check reports it
