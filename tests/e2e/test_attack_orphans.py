"""Per-job dirs against their users: a dir only named like a job's, and a job's own mess.

The hooks run as slurmd runs them (tests/helpers/jobhooks.py, the fake daemon); the attacker is
the unprivileged ``mpshevil``, who also owns the jobs here. A dir they make under an
ended job's name, back-dated and with a server of the configured binary in it, is no
orphan of ours: not CRITICAL, not removed by root. What they nest inside their own job's
dirs (deep dirs, FIFOs, links to root's files, files added while the Epilog works) is
removed whole by the Epilog and by ``remediate orphans``, and no link is followed.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from clirun import mps_health
from conftest import FAKE_SERVER
from hostile import ATTACKER, as_user, ensure_user, run_as
from jobhooks import JobHooks, daemon_pid, user_python
from mps_health.hostio import jobrecords
from pasted import commands

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root (the hooks chown and drop to the user)")


@pytest.fixture(scope="module")
def python() -> Iterator[str]:
    ensure_user(ATTACKER)
    base = Path(tempfile.mkdtemp(prefix="mpsh-userpy-", dir="/tmp"))
    base.chmod(0o755)
    try:
        found = user_python(base, ATTACKER)
        if found is None:
            pytest.skip(f"no Python that {ATTACKER} can run imports this checkout")
        yield found
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def hooks(python: str) -> Iterator[JobHooks]:
    h = JobHooks(ATTACKER, python)
    h.configure(node_name="n1", slurm={"timeout_s": 5}, orphans={"min_age_s": 60},
                commands={"scontrol": "/bin/false"},
                remediation={"audit_log": f"{h.base}/audit.log", "syslog": False,
                             "quit_timeout_s": 2, "term_timeout_s": 2})
    try:
        yield h
    finally:
        h.close()


def orphans(hooks: JobHooks) -> List[Dict[str, object]]:
    r = mps_health("check", "--config", str(hooks.config), "--only", "orphans",
                   "--format", "json")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    return [x for c in json.loads(r.stdout)["checks"] if c["name"] == "orphans"
            for x in c["results"]]


def remediate(hooks: JobHooks) -> subprocess.CompletedProcess:
    return mps_health("remediate", "orphans", "--config", str(hooks.config))


def user_server(pipe: Path) -> subprocess.Popen:
    """The configured server binary run by the attacker on ``pipe``."""
    p = subprocess.Popen([FAKE_SERVER], stdout=subprocess.PIPE, text=True,
                         start_new_session=True,
                         env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                         **as_user(ATTACKER))
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def as_attacker(*argv: str) -> None:
    r = run_as(ATTACKER, argv)
    assert r.returncode == 0, r.stderr


def back_date(*paths: Path) -> None:
    as_attacker("touch", "-h", "-d", "3 hours ago", *map(str, paths))


def root_file(hooks: JobHooks) -> Path:
    secret = hooks.base / "root-secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    return secret


def test_a_back_dated_job_named_dir_is_no_orphan_and_is_not_removed(hooks: JobHooks) -> None:
    pipe, log = hooks.pipe_dir("900"), hooks.parent / "nvidia-log_job900"
    as_attacker("mkdir", "-m", "0700", str(pipe), str(log))
    back_date(pipe, log)
    server = user_server(pipe)  # the configured binary: "genuine" by its exe
    try:
        results = orphans(hooks)
        assert [(r["state"], r["code"]) for r in results] == [("WARNING", "orphan-unrecorded")]
        message = str(results[0]["message"])
        assert f"owned by {ATTACKER} (uid {os.stat(pipe).st_uid})" in message
        assert "CRITICAL" not in {r["state"] for r in results}
        r = remediate(hooks)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "orphans on n1: 0" in r.stdout
        assert "was not made by our Prolog for that job: not an orphan of ours" in r.stdout
        assert pipe.is_dir() and log.is_dir() and server.poll() is None
    finally:
        server.kill()
        server.wait()


def test_a_recorded_job_s_server_is_still_critical(hooks: JobHooks) -> None:
    """The other side: the Prolog's own dirs of an ended job whose Epilog never ran, its
    daemon and the server it started still running (the server is the daemon's child)."""
    import mpsdaemon

    assert hooks.run("prolog", hooks.env("prolog", "901")).returncode == 0
    pipe = hooks.pipe_dir("901")
    pid = daemon_pid(pipe)
    assert pid is not None
    started = mpsdaemon.query(pipe, "fake_server_start")
    assert started.returncode == 0 and started.stdout.strip().isdigit(), started
    server = int(started.stdout)
    try:
        back_date(pipe, hooks.parent / "nvidia-log_job901")
        assert [(r["instance"], r["state"], r["code"]) for r in orphans(hooks)] == [
            ("job901", "CRITICAL", "orphan-server")]
    finally:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def nest_as_attacker(top: Path, depth: int, secret: Path) -> Path:
    """Dirs ``depth`` deep in ``top``, a FIFO, a file and links to root's file and dir."""
    deep = top.joinpath(*[f"n{i}" for i in range(depth)])
    as_attacker("mkdir", "-p", str(deep))
    as_attacker("mkfifo", str(deep / "fifo"))
    as_attacker("ln", "-s", str(secret), str(deep / "to-secret"))
    as_attacker("ln", "-s", str(secret.parent), str(top / "to-root-dir"))
    as_attacker("sh", "-c", f"echo x > {deep}/file && chmod 0500 {top}/n0")
    return deep


ADDER = """
import os, sys, time
os.chdir(sys.argv[1])
print("adding", flush=True)
end = time.monotonic() + 20
i = 0
while time.monotonic() < end:
    i += 1
    try:
        os.mkdir(f"a{i}")
        open(f"a{i}/f", "w").close()
    except OSError:
        time.sleep(0.001)
"""


def test_the_epilog_removes_whatever_the_job_user_nested(hooks: JobHooks, python: str) -> None:
    secret = root_file(hooks)
    assert hooks.run("prolog", hooks.env("prolog", "902")).returncode == 0
    pipe, log = hooks.pipe_dir("902"), hooks.parent / "nvidia-log_job902"
    deep = nest_as_attacker(pipe, 12, secret)
    nest_as_attacker(log, 3, secret)
    # A shell of the user inside the tree keeps adding while the Epilog removes it.
    adder = subprocess.Popen([python, "-c", ADDER, str(deep.parent)], stdout=subprocess.PIPE,
                             text=True, **as_user(ATTACKER))
    try:
        assert adder.stdout is not None and adder.stdout.readline() == "adding\n"
        time.sleep(0.3)
        e = hooks.run("epilog", hooks.env("epilog", "902"))
    finally:
        adder.kill()
        adder.wait()
    assert e.returncode == 0, e.stderr
    assert "Directory not empty" not in e.stderr and "cannot remove" not in e.stderr
    assert hooks.entries() == []
    assert secret.read_text() == "root's" and os.stat(secret).st_uid == 0
    assert os.stat(hooks.base).st_uid == 0
    records, error = jobrecords.load(str(hooks.site.state_dir))
    assert error == "" and [r.job_id for r in records] == []


def test_remediate_orphans_removes_a_nested_leftover_once_and_for_all(hooks: JobHooks) -> None:
    secret = root_file(hooks)
    assert hooks.run("prolog", hooks.env("prolog", "903")).returncode == 0
    pipe, log = hooks.pipe_dir("903"), hooks.parent / "nvidia-log_job903"
    pid = daemon_pid(pipe)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no Epilog ran: the dirs are left, with the record
    nest_as_attacker(pipe, 8, secret)
    back_date(pipe, log)
    assert [r["code"] for r in orphans(hooks)] == ["orphan-dir"]
    r = remediate(hooks)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "job903: ok" in r.stdout
    assert hooks.entries() == []
    assert secret.read_text() == "root's"
    assert jobrecords.load(str(hooks.site.state_dir))[0] == ()
    again = remediate(hooks)
    assert again.returncode == 0 and "orphans on n1: 0" in again.stdout
    assert [r["code"] for r in orphans(hooks)] == ["ok"]


def test_an_orphan_dirs_pasted_action_removes_it(hooks: JobHooks) -> None:
    """The action's commands, pasted as printed: the dry run changes nothing, the run
    removes the dirs (an ended job is no instance: a reset of it would name none)."""
    assert hooks.run("prolog", hooks.env("prolog", "906")).returncode == 0
    pipe, log = hooks.pipe_dir("906"), hooks.parent / "nvidia-log_job906"
    pid = daemon_pid(pipe)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no Epilog ran: the dirs are left, with the record
    back_date(pipe, log)
    (found,) = orphans(hooks)
    assert (found["instance"], found["code"]) == ("job906", "orphan-dir")
    pasted = [shlex.split(line) for line in commands(str(found["action"]))]
    cfg = str(hooks.config)
    assert pasted == [["mps-health", "remediate", "orphans", "--dry-run", "--config", cfg],
                      ["mps-health", "remediate", "orphans", "--config", cfg]]
    dry = mps_health(*pasted[0][1:])
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "job906 (job 906" in dry.stdout and "dry run: nothing was changed" in dry.stdout
    assert pipe.is_dir() and log.is_dir()
    done = mps_health(*pasted[1][1:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert not os.path.lexists(pipe) and not os.path.lexists(log)
    assert [r["code"] for r in orphans(hooks)] == ["ok"]


def test_a_tree_too_deep_is_named_once_with_the_command(hooks: JobHooks) -> None:
    from mps_health.hostio.safedirs import MAX_DEPTH

    assert hooks.run("prolog", hooks.env("prolog", "904")).returncode == 0
    pipe = hooks.pipe_dir("904")
    as_attacker("mkdir", "-p", str(pipe.joinpath(*["d"] * (MAX_DEPTH + 3))))
    e = hooks.run("epilog", hooks.env("epilog", "904"))
    assert e.returncode == 0, e.stderr
    lines = [line for line in e.stderr.splitlines() if "cannot remove" in line]
    assert len(lines) == 1, e.stderr
    assert f"rm -rf --one-file-system -- {pipe}" in lines[0]
    # The record stays for what is left; the dir is root's and 0700, the user locked out.
    (r,) = jobrecords.load(str(hooks.site.state_dir))[0]
    assert r.dirs == (str(pipe),)
    st = os.lstat(pipe)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    assert run_as(ATTACKER, ["touch", str(pipe / "more")]).returncode != 0
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(pipe)], check=True, timeout=60)


def test_after_its_job_the_user_cannot_make_a_name_ours_again(hooks: JobHooks) -> None:
    """The job's user removes their dirs themselves; the Epilog finds nothing but still
    drops the record, so a dir they make there afterwards is no orphan of ours."""
    assert hooks.run("prolog", hooks.env("prolog", "905")).returncode == 0
    pipe, log = hooks.pipe_dir("905"), hooks.parent / "nvidia-log_job905"
    pid = daemon_pid(pipe)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    as_attacker("rm", "-rf", str(pipe), str(log))
    assert hooks.run("epilog", hooks.env("epilog", "905")).returncode == 0
    assert jobrecords.load(str(hooks.site.state_dir))[0] == ()
    as_attacker("mkdir", "-m", "0700", str(pipe))
    back_date(pipe)
    server = user_server(pipe)
    try:
        assert [(r["state"], r["code"]) for r in orphans(hooks)] == [
            ("WARNING", "orphan-unrecorded")]
    finally:
        server.kill()
        server.wait()
