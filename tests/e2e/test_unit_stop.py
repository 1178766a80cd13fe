"""``mps-health unit stop`` (the systemd unit's ExecStop) against what a user does to the
pid file in the 0777 pipe dir, and ``remediate reset``, which finds daemons the same way
(``processes.daemons_in``: the configured binary, ``-d``, the daemon's uid, its environ
naming the pipe dir).

The attacker is the unprivileged ``mpshevil``: they delete the pid file, or point it at a
process of theirs (a ``sleep``, a copy of another program named like the daemon, their
own genuine daemon on another dir). The unit's daemon still gets a clean ``quit`` and
exits; what the attacker named is never touched; another instance's daemon neither.
"""
# ruff: noqa: F811  (the fixture test_user comes from remhelp)

import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from clirun import mps_health
from hostile import ATTACKER, as_user, run_as
from mpsdaemon import PID_FILE, query, start_daemon
from nodesite import Daemon, Site
from paths import FAKE_CONTROL
from remhelp import alive, daemons_of, remediating, test_user, uid_of  # noqa: F401


@pytest.fixture
def held() -> Iterator[List[subprocess.Popen]]:
    """The attacker's processes a test starts, ended afterwards."""
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def unit_stop(site: Site, pipe: Path, timeout: float = 10) -> subprocess.CompletedProcess:
    return mps_health("unit", "stop", "--pipe-dir", str(pipe), "--control", FAKE_CONTROL,
                      "--timeout", f"{timeout:g}", "--config", site.config())


def gone_within(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def quit_cleanly(daemon: Daemon) -> bool:
    """The daemon took 'quit' (it logs its exit), rather than being killed."""
    return "Exit with status 0" in (daemon.log_dir / "control.log").read_text()


def rewrite_pid_file(pipe: Path, pid: int) -> None:
    """As the attacker: the root daemon's pid file is not theirs to write, but the 0777
    dir is theirs to unlink in and create in."""
    pid_file = pipe / PID_FILE
    r = run_as(ATTACKER, ["rm", "-f", str(pid_file)])
    assert r.returncode == 0, r.stderr
    r = run_as(ATTACKER, ["dd", f"of={pid_file}", "status=none"], input=str(pid))
    assert r.returncode == 0, r.stderr
    assert pid_file.read_text() == str(pid) and pid_file.stat().st_uid != 0


def poser(site: Site, held: List[subprocess.Popen], program: str, name: str,
          args: List[str], pipe: Path) -> int:
    """The attacker's copy of ``program`` named ``name``, with ``pipe`` in its environ."""
    own = site.root / "evil-bin"
    own.mkdir(exist_ok=True)
    own.chmod(0o755)
    shutil.copy(program, own / name)
    p = subprocess.Popen([str(own / name), *args], env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                         stdin=subprocess.DEVNULL, **as_user(ATTACKER))
    held.append(p)
    return p.pid


def test_pid_file_deleted_by_a_user_the_daemon_still_quits(site: Site) -> None:
    daemon = site.start_daemon()
    assert daemon.pid is not None
    r = run_as(ATTACKER, ["rm", "-f", str(daemon.pipe_dir / PID_FILE)])
    assert r.returncode == 0 and not (daemon.pipe_dir / PID_FILE).exists(), r.stderr
    r = unit_stop(site, daemon.pipe_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"control daemon {daemon.pid} for {daemon.pipe_dir} has quit" in r.stdout
    assert "nothing to stop" not in r.stdout and r.stderr == ""
    assert gone_within(daemon.pid) and quit_cleanly(daemon)


@pytest.mark.parametrize("what", ["sleep", "named like the daemon"])
def test_pid_file_pointed_at_a_users_process_leaves_it_alone(site: Site, held, what) -> None:
    daemon = site.start_daemon()
    assert daemon.pid is not None
    if what == "sleep":
        bait = poser(site, held, "/bin/sleep", "sleep", ["300"], daemon.pipe_dir)
    else:  # argv0 and comm of the daemon, a daemon's flag, its pipe dir: another binary
        bait = poser(site, held, "/usr/bin/tail", "nvidia-cuda-mps-control",
                     ["-f", "/dev/null"], daemon.pipe_dir)
    rewrite_pid_file(daemon.pipe_dir, bait)
    r = unit_stop(site, daemon.pipe_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"the pid file names {bait}, which is not a control daemon of uid 0" in r.stdout
    assert f"control daemon {daemon.pid} for {daemon.pipe_dir} has quit" in r.stdout
    assert gone_within(daemon.pid) and quit_cleanly(daemon)
    assert held[0].poll() is None  # never signalled


def test_other_daemons_are_never_touched(site: Site) -> None:
    """Two more genuine daemons: the attacker's on a dir of theirs (the pid file points
    at it) and another instance's (root's) on its own dir. Only the unit's daemon quits."""
    daemon = site.start_daemon()
    other = site.start_daemon("other")
    evil_pipe, evil_log = site.dirs("evil")
    evil = start_daemon(evil_pipe, evil_log, cwd=str(site.root), **as_user(ATTACKER))
    assert daemon.pid is not None and other.pid is not None
    rewrite_pid_file(daemon.pipe_dir, evil)
    r = unit_stop(site, daemon.pipe_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"the pid file names {evil}" in r.stdout
    assert gone_within(daemon.pid) and quit_cleanly(daemon)
    time.sleep(0.2)
    for pid, pipe in ((evil, evil_pipe), (other.pid, other.pipe_dir)):
        assert alive(pid), f"{pid} was ended"
        assert query(pipe, "get_server_list").returncode == 0  # still serving


def test_no_daemon_of_the_units_user_is_nothing_to_stop(site: Site) -> None:
    """Only the attacker's daemon names the pipe dir (and the pid file): not the unit's,
    never quit or waited on."""
    pipe, _log = site.dirs()
    evil_log = site.dirs("evil")[1]
    evil = start_daemon(pipe, evil_log, cwd=str(site.root), **as_user(ATTACKER))
    r = unit_stop(site, pipe, timeout=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"the pid file names {evil}" in r.stdout
    assert f"no live control daemon of uid 0 for {pipe}: nothing to stop" in r.stdout
    assert alive(evil) and query(pipe, "get_server_list").returncode == 0


def test_reset_never_ends_another_uids_daemon_the_pid_file_names(site: Site) -> None:
    """remediate reset takes the instance's daemons from the same lookup: the attacker's
    genuine daemon serving the node's pipe dir (its pid file theirs) is a stray
    (daemon-foreign), neither quit nor signalled; root's daemon is started beside it."""
    pipe, _log = site.dirs()
    evil_log = site.dirs("evil")[1]
    evil = start_daemon(pipe, evil_log, cwd=str(site.root), **as_user(ATTACKER))
    r = mps_health("remediate", "reset", "--config", site.config(remediating(site)))
    assert f"the pid file names {evil}, which is not a control daemon of uid 0" in r.stdout
    assert "ask control daemon" not in r.stdout and f"{evil}: " not in r.stdout, r.stdout
    assert alive(evil), r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


def test_reset_replaces_roots_daemon_after_the_daemon_user_changed(site: Site,
                                                                   test_user) -> None:
    """Root's daemon is the instance's to replace (only root can have started it): with
    ``mps.daemon_user`` now a user, a reset ends it and starts theirs."""
    root_daemon = site.start_daemon()
    assert root_daemon.pid is not None
    cfg = site.config(remediating(site), mps={"daemon_user": test_user.pw_name,
                                              "dir_owner": test_user.pw_name})
    r = mps_health("remediate", "reset", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert gone_within(root_daemon.pid), r.stdout
    (pid,) = daemons_of(site.pipe)
    assert uid_of(pid) == test_user.pw_uid
