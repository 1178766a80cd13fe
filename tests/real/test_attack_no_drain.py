"""What an ordinary user can do on a node never gets it drained: slurmd's health check
(``mps-health-healthcheck``) against a real slurmctld, run twice with a one-failure
drain threshold, while a user plants entries and a fake daemon beside a healthy one."""

import shutil
import subprocess

import pytest
from clirun import installed
from hostile import ATTACKER, Held, as_user, ensure_user, run_as
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
    from mps_health.probes.slurm import parse_node_line

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


def drain_on_warning(site, extra: str = "") -> str:
    """A config that drains on any WARNING after one failed run: the harshest setting."""
    return site.config(remediating(site),
                       "checks:\n  only: [daemon, control, directories, strays, logs, orphans]\n"
                       "healthcheck:\n  fail_runs: 1\n  drain_on: warning\n" + extra)


def test_a_held_genuine_server_and_a_log_link_never_drain(slurm_cluster, site) -> None:
    """The configured server binary run by a user and held at its exec (none of its code
    runs), on a pipe dir of theirs and on the instance's own; a link planted as
    ``control.log`` if the log dir were open: no CRITICAL, no drain, even with
    ``drain_on: warning``."""
    from paths import FAKE_SERVER

    cluster = slurm_cluster
    assert not drained(cluster)
    ensure_user(ATTACKER)
    pipe, log = site.pipe, site.log
    make_dirs(pipe)
    make_dirs(log, mode=0o755)
    start_daemon(pipe, log)
    cfg = drain_on_warning(site)
    theirs = site.root / "evil-pipe"
    make_dirs(theirs)
    with Held(ATTACKER, [FAKE_SERVER, ""], {"CUDA_MPS_PIPE_DIRECTORY": str(theirs)}), \
            Held(ATTACKER, [FAKE_SERVER, ""], {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}):
        r = run_as(ATTACKER, ["ln", "-s", "/etc/shadow", str(log / "control.log")])
        assert r.returncode != 0  # the log dir is the daemon user's: no entry of theirs
        runs = [hc(cluster, cfg) for _ in range(2)]
    for run in runs:
        assert run.returncode == 1, run.stdout + run.stderr  # WARNINGs, nothing more
        assert "drained (" not in run.stdout
        assert "CRITICAL" not in run.stdout
    assert "server-unclaimed" in runs[0].stdout
    assert "a local user can cause these, so they never drain: " in runs[0].stdout
    assert not drained(cluster)


def test_a_back_dated_job_named_dir_with_a_held_server_never_drains(slurm_cluster,
                                                                    site) -> None:
    """Per-job layout: a user makes a dir named like an ended job's, back-dates it by a
    day and holds the configured server binary in it. No job record says it is that
    job's, so it is no orphan of ours: no CRITICAL, no drain, nothing removed."""
    from paths import FAKE_SERVER

    cluster = slurm_cluster
    assert not drained(cluster)
    ensure_user(ATTACKER)
    top = site.root / "tmp"
    make_dirs(top, mode=0o1777)
    per_job = {"mps": {"layout": "per-job", "pipe_dir": f"{top}/nvidia-mps_job{{job}}",
                       "log_dir": f"{top}/nvidia-log_job{{job}}", "dir_owner": "job"},
               "orphans": {"min_age_s": 60}}
    cfg = site.config(remediating(site), per_job,
                      "checks:\n  only: [orphans, strays]\n"
                      "healthcheck:\n  fail_runs: 1\n  drain_on: warning\n")
    squat = top / "nvidia-mps_job4242"
    r = run_as(ATTACKER, ["mkdir", "-m", "0777", str(squat)])
    assert r.returncode == 0, r.stderr
    assert run_as(ATTACKER, ["touch", "-d", "1 day ago", str(squat)]).returncode == 0
    with Held(ATTACKER, [FAKE_SERVER, ""], {"CUDA_MPS_PIPE_DIRECTORY": str(squat)}):
        runs = [hc(cluster, cfg) for _ in range(2)]
    for run in runs:
        assert run.returncode in (0, 1), run.stdout + run.stderr
        assert "CRITICAL" not in run.stdout and "drained (" not in run.stdout
    assert "orphan-unrecorded" in runs[0].stdout, runs[0].stdout
    assert squat.is_dir()  # root removed nothing of theirs
    assert not drained(cluster)


# A user's process that connects to the control socket and sends nothing: it holds the
# daemon (every query and client waits) for as long as it lives.
HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("held", flush=True)
time.sleep(3600)
"""


def test_a_users_idle_connection_held_across_ten_runs_never_drains(slurm_cluster, site) -> None:
    """Unblock on: the user reconnects before each of ten runs; each run frees the daemon
    (it answers again right after), none drains. Unblock off: the blocker is named each
    run, and still nothing drains, even with a one-failure threshold."""
    from mpsdaemon import query

    cluster = slurm_cluster
    assert not drained(cluster)
    ensure_user(ATTACKER)
    make_dirs(site.pipe, site.log)
    start_daemon(site.pipe, site.log)
    holders: list = []

    def hold() -> subprocess.Popen:
        p = subprocess.Popen(["python3", "-c", HOLDER, str(site.pipe / "control")],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             **as_user(ATTACKER))
        holders.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == b"held"
        return p

    try:
        for unblock in ("true", "false"):
            cfg = site.config(remediating(site),
                              "checks:\n  only: [daemon, control, blockers, directories]\n"
                              "control:\n  timeout_s: 1.0\n"
                              f"healthcheck:\n  fail_runs: 1\n  unblock: {unblock}\n")
            holder = hold()
            for _ in range(10):
                if unblock == "true" and holder.poll() is not None:
                    holder = hold()  # the user connects again after each unblock
                run = hc(cluster, cfg)
                assert "drained (" not in run.stdout and "not drained: " not in run.stdout, \
                    run.stdout
                if unblock == "true":
                    assert f"MPS-HC: unblocked node: ended pid {holder.pid}" in run.stdout, \
                        run.stdout
                    assert holder.wait(10) is not None
                    assert query(site.pipe, "get_server_list").returncode == 0
                else:
                    assert "blocked-connection" in run.stdout and f"pid {holder.pid}" \
                        in run.stdout, run.stdout
            assert not drained(cluster)
            holder.kill()
            holder.wait()
    finally:
        for p in holders:
            p.kill()
            p.wait()
    assert not drained(cluster)
