"""The real Slurm test clusters themselves: jobs run, GRES are handed out, stop leaves nothing.

Each test runs on this machine's Slurm and on Slurm 24.11 in the Debian 13 root.
"""

import os
import time
from typing import Optional

import pytest
from mps_health.probes.slurm import parse_node_line
from slurmcluster import SlurmCluster
from slurmroot import SlurmRoot

pytestmark = pytest.mark.slurm


def job_env(cluster: SlurmCluster, gres: str, user=None) -> dict:
    r = cluster.run(["srun", f"--gres={gres}", "env"], user=user, timeout=60)
    assert r.returncode == 0, r.stderr + cluster.logs()
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def test_mps_job_gets_thread_percentage_and_a_device(slurm_cluster: SlurmCluster) -> None:
    env = job_env(slurm_cluster, "mps:50")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")


def test_gpu_job_as_ordinary_user(slurm_cluster: SlurmCluster, slurm_user: str) -> None:
    env = job_env(slurm_cluster, "gpu:1", user=slurm_user)
    assert env["SLURM_JOB_USER"] == slurm_user
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_running_mps_job_shows_in_gres_used(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.start_job(["srun", "--gres=mps:50", "sleep", "60"])
    try:
        slurm_cluster.wait_running(1)
        line = slurm_cluster.node_line()
        print(slurm_cluster.version, line[line.find("Gres="):line.find(" NodeAddr")])
        assert "Gres=gpu:2,mps:200" in line
        used = {g.name: g for g in parse_node_line(line).gres_used or ()}
        # 22.05 counts the job: mps:(null):1(IDX:0); 24.11 the shares, per GPU:
        # mps:(null):50(50/100,0/100).
        shares = 1 if slurm_cluster.version.split()[-1].startswith("22.") else 50
        assert used["gpu"].quantity == 0 and used["mps"].quantity == shares
        assert used["mps"].indices == (0,)
        assert slurm_cluster.node_state() == "MIXED"
    finally:
        slurm_cluster.cancel_all()
        job.wait(30)
    slurm_cluster.wait_state(lambda s: s == "IDLE", 30)


def test_stop_leaves_no_process(slurm_where: Optional[SlurmRoot]) -> None:
    cluster = SlurmCluster(node_name="stopnode", root=slurm_where).start()
    pids = [p.pid for p in cluster.procs.values()]
    cluster.start_job(["srun", "--gres=gpu:1", "sleep", "300"])
    cluster.wait_running(1)
    conf = str(cluster.conf)
    cluster.stop()
    time.sleep(0.2)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _has_conf(p, conf)]
    assert leftovers == []
    assert not cluster.dir.exists()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _has_conf(pid: str, conf: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"SLURM_CONF={conf}".encode() in f.read().split(b"\0")
    except OSError:
        return False
