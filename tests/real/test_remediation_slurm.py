"""``remediate orphans``, ``drain`` and ``resume`` against a real slurmctld and squeue."""
# ruff: noqa: F811  (the fixture test_user comes from remhelp)

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from clirun import mps_health
from mps_health.hostio import jobrecords
from mps_health.probes.slurm import parse_node_line
from mpsdaemon import start_daemon
from nodesite import Site
from remhelp import (  # noqa: F401
    alive,
    daemons_of,
    make_dirs,
    remediating,
    test_user,
    uid_of,
)
from slurm_fixture import _require
from slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

NODE = "remnode"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    _require()
    c = SlurmCluster(node_name=NODE).start()
    yield c
    c.stop()


def per_job_config(site: Site) -> str:
    return site.config(remediating(site), node_name=NODE, mps={"layout": "per-job"},
                       pipe=f"{site.root}/nvidia-mps_job{{job}}",
                       log=f"{site.root}/nvidia-log_job{{job}}", orphans={"min_age_s": 0})


def user_daemon(base: Path, job: str, user) -> int:
    """A per-job fake daemon run by the job's user, in dirs that user owns."""
    pipe, log = base / f"nvidia-mps_job{job}", base / f"nvidia-log_job{job}"
    make_dirs(pipe, log, mode=0o700)
    for d in (pipe, log):
        os.chown(d, user.pw_uid, user.pw_gid)
    return start_daemon(pipe, log, env={"PATH": "/usr/bin:/bin"}, inherit=False, python=None,
                        user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/")


def run(cluster: SlurmCluster, cfg: str, *args: str) -> subprocess.CompletedProcess:
    return mps_health("remediate", *args, "--config", cfg, env={"SLURM_CONF": str(cluster.conf)})


def test_orphans_of_ended_jobs_are_quit_as_their_user_and_removed(cluster: SlurmCluster,
                                                                   site,
                                                                   test_user) -> None:
    job = cluster.start_job(["srun", "sleep", "120"])
    try:
        (running,) = cluster.wait_running(1)
        live = user_daemon(site.root, running, test_user)
        gone = user_daemon(site.root, "99999", test_user)
        target = site.root / "precious"
        make_dirs(target)
        (target / "keep").write_text("k")
        (site.root / "nvidia-mps_job88888").symlink_to(target)  # an orphan entry that is a symlink
        # Only what a Prolog recorded for its job is an orphan (hostio/jobrecords.py): these
        # dirs stand for what ours made; an unrecorded job-named dir would be left alone.
        for job_id in ("99999", "88888"):
            assert jobrecords.add(str(site.state_dir), job_id, test_user.pw_uid,
                                  [str(site.root / f"nvidia-mps_job{job_id}"),
                                   str(site.root / f"nvidia-log_job{job_id}")]) == ""
        cfg = per_job_config(site)
        dry = run(cluster, cfg, "orphans", "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"jobs Slurm lists here: {running}" in dry.stdout
        assert "job99999 (job 99999" in dry.stdout and "job88888" in dry.stdout
        assert f"job{running} " not in dry.stdout
        assert f"as its user (uid {test_user.pw_uid})" in dry.stdout
        assert alive(gone)
        r = run(cluster, cfg, "orphans")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"quit as {test_user.pw_name}" in r.stdout
        assert not alive(gone)
        assert not (site.root / "nvidia-mps_job99999").exists()
        assert not (site.root / "nvidia-log_job99999").exists()
        assert not os.path.lexists(site.root / "nvidia-mps_job88888")
        assert (target / "keep").read_text() == "k"  # the symlink's target is untouched
        assert alive(live) and (site.root / f"nvidia-mps_job{running}").is_dir()
        assert uid_of(live) == test_user.pw_uid
        audit = (site.root / "audit.log").read_text()
        assert "action=orphans event=remove result=ok instance=job99999" in audit
    finally:
        cluster.cancel_all()
        job.wait(30)


def test_no_job_list_means_no_orphan(cluster: SlurmCluster, site, test_user) -> None:
    pid = user_daemon(site.root, "77777", test_user)
    cfg = per_job_config(site)
    cluster.stop_controller()
    try:
        r = run(cluster, cfg, "orphans")
    finally:
        cluster.start_controller()
        cluster.wait_state(lambda st: st.startswith("IDLE"), 60)
    assert r.returncode == 3
    assert "cannot list the jobs on remnode, so no instance is judged an orphan" in r.stderr
    assert alive(pid) and (site.root / "nvidia-mps_job77777").is_dir()


def test_drain_and_resume_by_hand_follow_the_tag_rules(cluster: SlurmCluster, site) -> None:
    cluster.wait_state(lambda st: st.startswith("IDLE") and "DRAIN" not in st, 60)
    cfg = per_job_config(site)
    r = run(cluster, cfg, "drain", "--reason", "resetting MPS")
    assert r.returncode == 0, r.stdout + r.stderr
    v = parse_node_line(cluster.scontrol("show", "node", NODE, "-o"))
    assert "DRAIN" in v.flags and v.reason == "MPS-HC: manual: resetting MPS"
    again = run(cluster, cfg, "drain")
    assert again.returncode == 0 and "already drained by us" in again.stdout
    back = run(cluster, cfg, "resume")
    assert back.returncode == 0 and "resumed" in back.stdout
    assert "DRAIN" not in parse_node_line(cluster.scontrol("show", "node", NODE, "-o")).flags
    cluster.scontrol("update", f"NodeName={NODE}", "State=DRAIN", "Reason=firmware update")
    try:
        refused = run(cluster, cfg, "resume")
        assert refused.returncode == 1
        assert "refused: drained by someone else (firmware update): left alone" in refused.stdout
        over = run(cluster, cfg, "drain", "--reason", "mine")
        assert over.returncode == 1
        v = parse_node_line(cluster.scontrol("show", "node", NODE, "-o"))
        assert v.reason == "firmware update"
    finally:
        cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
    audit = (site.root / "audit.log").read_text()
    assert "action=drain event=drain result=ok" in audit
    assert "action=resume event=resume result=refused" in audit


def test_per_job_reset_restarts_the_daemon_as_the_jobs_user(cluster: SlurmCluster, site,
                                                           test_user) -> None:
    cluster.wait_state(lambda st: st.startswith("IDLE") and "DRAIN" not in st, 60)
    job = cluster.start_job(["srun", "sleep", "120"], user=test_user.pw_name)
    try:
        (running,) = cluster.wait_running(1)
        old = user_daemon(site.root, running, test_user)
        os.kill(old, 9)  # stale, as after a crash
        cfg = per_job_config(site)
        r = run(cluster, cfg, "reset", f"job{running}")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"as {test_user.pw_name} (uid {test_user.pw_uid})" in r.stdout
        (new,) = daemons_of(site.root / f"nvidia-mps_job{running}")
        assert uid_of(new) == test_user.pw_uid
        assert os.lstat(site.root / f"nvidia-mps_job{running}").st_uid == test_user.pw_uid
        gone = run(cluster, cfg, "reset", "job424242")
        assert gone.returncode == 3 and "no MPS instance named 'job424242'" in gone.stderr
        make_dirs(site.root / "nvidia-mps_job55555", site.root / "nvidia-log_job55555")
        ended = run(cluster, cfg, "reset", "job55555")
        # Dirs of a job Slurm does not run here are no instance (a user can make such
        # dirs in /tmp): reset refuses them; `remediate orphans` is what cleans them up.
        assert ended.returncode == 3
        assert "no MPS instance named 'job55555'" in ended.stderr
        assert (site.root / "nvidia-mps_job55555").is_dir()
    finally:
        cluster.cancel_all()
        job.wait(30)
