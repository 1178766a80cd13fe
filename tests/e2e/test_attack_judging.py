"""Attacks on the check's verdicts, run as an unprivileged user against a real fake daemon.

A user may create anything in a world-writable pipe dir or in /tmp and may start any
process: none of that may turn into a CRITICAL (a drain) unless it breaks what MPS
itself uses, and then the finding names who did it.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Tuple

import pytest
from clirun import mps_health
from hostile import (
    ATTACKER,
    VICTIM,
    as_user,
    ensure_user,
    exec_done,
    run_as,
    squeue_line,
)
from mpsdaemon import kill_daemon, start_daemon
from nodesite import Daemon, Site

SYSTEM_PYTHON = "/usr/bin/python3"  # one every user can run (this venv's is under /root)


def check_json(config: Path, *extra: str) -> Tuple[int, dict]:
    r = mps_health("check", "--config", str(config), "--only", "daemon,directories",
                   "--format", "json", *extra)
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def findings(report: dict) -> dict:
    return {(p["instance"], p["code"]): p for p in report["problems"]}


@pytest.fixture
def node(site: Site) -> Tuple[Path, Daemon]:
    """A node-layout instance whose pipe dir is 0777 (as MPS needs), served by a root daemon."""
    daemon = site.start_daemon()
    return Path(site.config()), daemon


def test_a_strangers_link_in_the_pipe_dir_is_a_warning_naming_them(node) -> None:
    config, daemon = node
    assert check_json(config)[0] == 0
    r = run_as(ATTACKER, ["ln", "-s", "/etc/shadow", str(daemon.pipe_dir / "foo")])
    assert r.returncode == 0, r.stderr
    rc, report = check_json(config)
    found = findings(report)
    assert rc == 1, report["problems"]
    entry = found[("node", "pipe-entry-foreign")]
    assert entry["state"] == "WARNING" and f"belongs to {ATTACKER} " in entry["message"]


def test_a_strangers_process_posing_as_the_daemon_is_no_daemon(node, site: Site) -> None:
    """A copy of a program named like the control binary, started with -f (a daemon's
    flag) on the instance's pipe dir: it runs another binary, so it is no daemon at all
    (tests/e2e/test_attack_identity.py: the strays check names its owner)."""
    config, daemon = node
    ensure_user(ATTACKER)
    fake = site.root / "evil"
    fake.mkdir()
    shutil.copy("/usr/bin/tail", fake / "nvidia-cuda-mps-control")  # comm and argv0 as MPS's
    proc = subprocess.Popen([str(fake / "nvidia-cuda-mps-control"), "-f", "/dev/null"],
                            env={"CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir)},
                            **as_user(ATTACKER))
    try:
        exec_done(proc.pid)  # its command line and environment in /proc
        rc, report = check_json(config)
        found = findings(report)
        assert ("node", "daemon-duplicate") not in found
        assert ("node", "daemon-foreign") not in found
        assert rc == 0, report
    finally:
        proc.kill()
        proc.wait()


def test_a_hijacked_control_socket_is_critical_naming_the_owner(node, site: Site) -> None:
    """The user renames the daemon's socket and binds their own answering queries."""
    config, daemon = node
    ensure_user(ATTACKER)
    script = site.root / "hijack.py"
    script.write_text(f"""
import os, socket, sys, time
pipe = {str(daemon.pipe_dir)!r}
os.rename(pipe + "/control", pipe + "/control.real")
s = socket.socket(socket.AF_UNIX)
s.bind(pipe + "/control")
s.listen(8)
print("ready", flush=True)
time.sleep(60)
""")
    script.chmod(0o644)
    proc = subprocess.Popen([SYSTEM_PYTHON, str(script)], stdout=subprocess.PIPE, text=True,
                            **as_user(ATTACKER))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        rc, report = check_json(config)
        found = findings(report)
        owner = found[("node", "pipe-entry-owner")]
        assert owner["state"] == "CRITICAL" and rc == 2
        assert f"/control is owned by {ATTACKER} " in owner["message"]
        assert ("node", "pipe-entry-foreign") in found  # control.real: the moved socket
    finally:
        proc.kill()
        proc.wait()


def test_the_daemon_entries_of_the_daemons_user_pass(node) -> None:
    config, daemon = node
    rc, report = check_json(config)
    assert (rc, report["problems"]) == (0, [])
    assert set(os.listdir(daemon.pipe_dir)) >= {"control", "control_lock", "log"}


# --- per-job layout: /tmp is everyone's ----------------------------------------------------

@pytest.fixture
def per_job(site: Site) -> Tuple[Path, Path]:
    config = site.config(site.per_job(), commands={"squeue": site.squeue()})
    return Path(config), site.sticky_tmp()


def test_a_dir_named_like_a_job_that_slurm_does_not_run_here_is_not_an_instance(
        per_job, site: Site) -> None:
    config, parent = per_job
    r = run_as(ATTACKER, ["mkdir", str(parent / "nvidia-mps_job4242")])
    assert r.returncode == 0, r.stderr
    rc, report = check_json(config)
    assert (rc, report["problems"]) == (0, [])


def test_a_dir_squatted_for_a_real_job_is_not_that_jobs_instance(per_job,
                                                                  site: Site) -> None:
    """Job 4242 of the victim runs here; the attacker made its dir first."""
    config, parent = per_job
    ensure_user(VICTIM)
    site.squeue(squeue_line("4242", VICTIM))
    r = run_as(ATTACKER, ["mkdir", "-m", "0777", str(parent / "nvidia-mps_job4242")])
    assert r.returncode == 0, r.stderr
    rc, report = check_json(config)
    assert rc != 2 and not [p for p in report["problems"] if p["instance"] == "job4242"]


def test_slurm_unreachable_leaves_per_job_instances_unknown(per_job, site: Site) -> None:
    config, parent = per_job
    (site.root / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to "
                                       "contact slurm controller' >&2\nexit 1\n")
    r = run_as(ATTACKER, ["mkdir", str(parent / "nvidia-mps_job4242")])
    assert r.returncode == 0, r.stderr
    rc, report = check_json(config)
    assert rc == 3
    assert "per-job instances need Slurm's job list" in report["problems"][0]["message"]


def test_the_jobs_own_user_breaking_their_dir_is_at_most_a_warning(per_job,
                                                                   site: Site) -> None:
    """A job's user owns its pipe dir: what they do to it hurts their job only."""
    config, parent = per_job
    ensure_user(VICTIM)
    site.squeue(squeue_line("77", VICTIM))
    for name in ("nvidia-mps_job77", "nvidia-log_job77"):
        r = run_as(VICTIM, ["mkdir", "-m", "0777", str(parent / name)])
        assert r.returncode == 0, r.stderr
    r = run_as(VICTIM, ["ln", "-s", "/etc", str(parent / "nvidia-mps_job77" / "control")])
    assert r.returncode == 0, r.stderr
    rc, report = check_json(config)
    found = findings(report)
    assert rc == 1, report["problems"]
    assert found[("job77", "pipe-entry-bad")]["state"] == "WARNING"
    assert found[("job77", "pipe-dir-mode")]["state"] == "WARNING"


def test_a_fake_daemon_by_its_own_user_in_the_job_dir_is_judged(per_job,
                                                                site: Site) -> None:
    """The real per-job daemon (the job user's) is found only for a Slurm job."""
    config, parent = per_job
    pw = ensure_user(VICTIM)
    site.squeue(squeue_line("78", VICTIM))
    pipe, log = parent / "nvidia-mps_job78", parent / "nvidia-log_job78"
    for d in (pipe, log):
        d.mkdir(mode=0o700)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    daemon = start_daemon(pipe, log, env={"PATH": "/usr/bin:/bin"}, inherit=False,
                          python=SYSTEM_PYTHON, **as_user(VICTIM))
    try:
        rc, report = check_json(config)
        assert (rc, report["problems"]) == (0, [])
    finally:
        kill_daemon(daemon)
