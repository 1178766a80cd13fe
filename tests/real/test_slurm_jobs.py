"""Per-job MPS under a real Slurm: jobs of an ordinary user get their own daemon and leave nothing.

The test cluster (tests/helpers/slurmcluster.py) runs the hooks `mps-health slurm install`
wrote, from a per-job config whose control binary is the fake daemon; jobs run as the
test user. On this machine's Slurm and on Slurm 24.11 in the Debian 13 root (whose
hooks are installed by, and run, the root's own mps-health). After each job (finished or scancelled) the node goes back to IDLE only
once the Epilog has run, and then no dir and no MPS process of the job may be left.
"""

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest
from jobhooks import FAKE_CONTROL, JobHooks, daemon_pid, hooks_for_slurm, proc_uid
from slurmcluster import SlurmCluster, SlurmClusterError

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hooks(slurm_user: str, slurm_where) -> Iterator[JobHooks]:
    yield from hooks_for_slurm(slurm_user, slurm_where)


@pytest.fixture(scope="module")
def cluster(hooks: JobHooks, slurm_where) -> Iterator[SlurmCluster]:
    scripts = {h.replace("-", "_"): str(hooks.hooks / f"mps-health-{h}")
               for h in ("prolog", "task-prolog", "epilog")}
    c = SlurmCluster(node_name="jobnode", root=slurm_where, **scripts)
    try:
        c.start()
    except SlurmClusterError as e:
        pytest.fail(f"could not start the Slurm test cluster: {e}", pytrace=False)
    yield c
    c.stop()


def run_env(cluster: SlurmCluster, user: str, *gres: str) -> Dict[str, str]:
    r = cluster.run(["srun", *gres, "env"], user=user, timeout=90)
    assert r.returncode == 0, r.stderr + cluster.logs()
    return dict(x.split("=", 1) for x in r.stdout.splitlines() if "=" in x)


def settle(cluster: SlurmCluster) -> None:
    """Wait until every job is gone and the node is IDLE (its epilogs have run)."""
    cluster.cancel_all(timeout=60)
    cluster.wait_state(lambda s: s == "IDLE", 60)


def test_mps_job_sees_its_own_pipe_dir(cluster: SlurmCluster, hooks: JobHooks) -> None:
    env = run_env(cluster, hooks.user, "--gres=mps:50")
    job = env["SLURM_JOB_ID"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(hooks.pipe_dir(job))
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(hooks.parent / f"nvidia-log_job{job}")
    settle(cluster)
    assert hooks.entries() == [] and hooks.processes() == []


def test_running_job_uses_a_daemon_of_its_user_and_scancel_leaves_nothing(
        cluster: SlurmCluster, hooks: JobHooks) -> None:
    query = (f"echo get_default_active_thread_percentage | {FAKE_CONTROL}; "
             "echo $CUDA_MPS_PIPE_DIRECTORY; sleep 300")
    job = cluster.start_job(["srun", "--gres=mps:50", "sh", "-c", query], user=hooks.user)
    try:
        [job_id] = cluster.wait_running(1, timeout=60)
        assert job.stdout is not None
        answer, pipe = job.stdout.readline().strip(), job.stdout.readline().strip()
        assert answer == "100.0", answer + cluster.logs()  # the task reached the daemon
        assert pipe == str(hooks.pipe_dir(job_id))
        pid = daemon_pid(Path(pipe))
        assert pid is not None and proc_uid(pid) == hooks.pw.pw_uid
        assert os.stat(pipe).st_uid == hooks.pw.pw_uid
        print(f"job {job_id}: daemon {pid} (uid {proc_uid(pid)}) in {pipe}")
    finally:
        cluster.run(["scancel", *cluster.job_ids()], timeout=30)
        job.wait(60)
    settle(cluster)
    assert hooks.entries() == [] and hooks.processes() == []
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    # tmpfiles judges the machine's /tmp aging rules, not these dirs: skipped here.
    r = subprocess.run([*hooks.mps_health, "check", "--config",
                        str(hooks.config), "--skip", "tmpfiles", "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    report = json.loads(r.stdout)
    daemon = [x for c in report["checks"] if c["name"] == "daemon" for x in c["results"]]
    assert [d["message"] for d in daemon] == [
        "no MPS instance on this node (per-job layout, no job)"]
    assert report["problems"] == [] and r.returncode == 0


def test_whole_gpu_and_cpu_jobs_get_no_daemon(cluster: SlurmCluster, hooks: JobHooks) -> None:
    gpu = run_env(cluster, hooks.user, "--gres=gpu:1")
    assert gpu["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in gpu
    cpu = run_env(cluster, hooks.user)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in cpu and "CUDA_VISIBLE_DEVICES" not in cpu
    settle(cluster)
    assert hooks.entries() == [] and hooks.processes() == []


def test_two_mps_jobs_at_once_get_two_daemons(cluster: SlurmCluster, hooks: JobHooks) -> None:
    jobs = [cluster.start_job(["srun", "--gres=mps:50", "sleep", "300"], user=hooks.user)
            for _ in range(2)]
    try:
        ids = cluster.wait_running(2, timeout=60)
        deadline = time.monotonic() + 30  # RUNNING comes before the step's prolog ends
        pids = {daemon_pid(hooks.pipe_dir(j)) for j in ids}
        while None in pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = {daemon_pid(hooks.pipe_dir(j)) for j in ids}
        assert None not in pids and len(pids) == 2
    finally:
        settle(cluster)
        for j in jobs:
            j.wait(60)
    assert hooks.entries() == [] and hooks.processes() == []


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_failed_start_drains_the_node_and_leaves_nothing(
        make_slurm_cluster, hooks: JobHooks) -> None:
    """Prolog exit 1 (on_start_failure: fail): Slurm drains the node and holds the job."""
    broken = JobHooks(hooks.user, hooks.python, control="/bin/true",
                      jobs={"start_timeout_s": 1}, mps_health=hooks.mps_health)
    try:
        scripts = {h.replace("-", "_"): str(broken.hooks / f"mps-health-{h}")
                   for h in ("prolog", "task-prolog", "epilog")}
        c = make_slurm_cluster(node_name="failnode", **scripts)
        batch = c.run(["sbatch", "--gres=mps:50", "--output=/dev/null", "--wrap", "true"],
                      user=hooks.user, timeout=60)
        assert batch.returncode == 0, batch.stderr
        state = c.wait_state(lambda s: "DRAIN" in s, 60)
        line = c.node_line()
        print(f"after the failed prolog: State={state}; {line[line.find('Reason='):]}")
        assert "Reason=Prolog error" in line
        squeue = c.run(["squeue", "-h", "-o", "%T|%r"]).stdout.strip()
        print(f"the batch job: {squeue}")
        assert squeue.endswith("|launch failed requeued held")
        assert broken.entries() == [] and broken.processes() == []
        c.cancel_all()
    finally:
        broken.close()
