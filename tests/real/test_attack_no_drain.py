"""What an ordinary user can do on a node never gets it drained: slurmd's health check
(``mps-health-healthcheck``) against a real slurmctld, run twice with a one-failure
drain threshold, while a user plants entries and a fake daemon beside a healthy one."""

import shutil
import subprocess

import pytest
from clirun import installed
from hostile import ATTACKER, as_user, ensure_user, run_as
from mpsdaemon import start_daemon
from remhelp import make_dirs, remediating
from slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm


def hc(cluster: SlurmCluster, cfg: str) -> subprocess.CompletedProcess:
    env = {"SLURM_CONF": str(cluster.conf), "SLURMD_NODENAME": cluster.node_name,
           "PATH": cluster.env["PATH"]}
    return subprocess.run([installed("mps-health-healthcheck"), "--config", cfg], capture_output=True,
                          text=True, timeout=90, env=env)


def drained(cluster: SlurmCluster) -> bool:
    from mps_health.core.probes.slurm import parse_node_line

    view = parse_node_line(cluster.scontrol("show", "node", cluster.node_name, "-o"))
    return bool({"DRAIN", "DOWN"}.intersection(view.flags))


def test_a_strangers_link_and_fake_daemon_never_drain(slurm_cluster, site) -> None:
    cluster = slurm_cluster
    assert not drained(cluster)
    ensure_user(ATTACKER)
    pipe, log = site.pipe, site.log
    make_dirs(pipe, log)
    cfg = site.config(remediating(site),
                      "checks:\n  only: [daemon, control, directories, strays]\n"
                      "healthcheck:\n  fail_runs: 1\n")
    start_daemon(pipe, log)
    r = run_as(ATTACKER, ["ln", "-s", "/etc/shadow", str(pipe / "x\nOK daemon[node]: fine")])
    assert r.returncode == 0, r.stderr
    fake = site.root / "evil"
    fake.mkdir()
    fake.chmod(0o755)
    # Copies named like MPS's daemon (started with -f) and server: argv0 and comm as theirs.
    shutil.copy("/usr/bin/tail", fake / "nvidia-cuda-mps-control")
    shutil.copy("/bin/sleep", fake / "nvidia-cuda-mps-server")
    posers = [subprocess.Popen(argv, env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                               **as_user(ATTACKER))
              for argv in ([str(fake / "nvidia-cuda-mps-control"), "-f", "/dev/null"],
                           [str(fake / "nvidia-cuda-mps-server"), "120"])]
    try:
        runs = [hc(cluster, cfg) for _ in range(2)]
    finally:
        for poser in posers:
            poser.kill()
            poser.wait()
    for run in runs:
        assert run.returncode == 1, run.stdout + run.stderr  # WARNINGs, nothing more
        assert "drained (" not in run.stdout
    assert "pipe-entry-foreign" in runs[0].stdout and "mps-impostor" in runs[0].stdout
    assert "server-orphaned" not in runs[0].stdout
    assert not drained(cluster)
