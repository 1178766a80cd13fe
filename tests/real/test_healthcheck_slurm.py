"""The HealthCheckProgram against a real slurmctld: drain, resume, anti-flap, tag rules.

These run ``mps-health-healthcheck`` by hand (as slurmd would: SLURMD_NODENAME set) so
each run is one step of the test; test_healthcheck_slurmd.py lets slurmd itself run
it. On this machine's Slurm and on Slurm 24.11 in the Debian 13 root (reached through
the cluster's client wrappers on PATH). Only the control and directories checks are enabled: other test sessions on this
machine start fake daemons and servers of their own, which the node-wide daemon check
would (rightly) report.
"""

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest
from clirun import installed
from mps_health.healthcheck.detach import RESULT_FILE, format_result
from mps_health.hostio.filelock import node_lock
from mpsdaemon import start_daemon, stop_process
from nodesite import Site
from remhelp import remediating
from slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

NODE = "hcnode"
PEERS = ("hcpeer1", "hcpeer2", "hcpeer3")  # declared only, in their own cluster: DOWN


@pytest.fixture(scope="module")
def cluster(slurm_where) -> Iterator[SlurmCluster]:
    c = SlurmCluster(node_name=NODE, extra_conf=["RebootProgram=/bin/true"],
                     root=slurm_where).start()
    yield c
    c.stop()


def write_hc_config(site: Site, healthcheck: str = "", control_timeout: float = 1.0,
                    scontrol_timeout: float = 10.0) -> str:
    site.dirs()
    return site.config(remediating(site), f"healthcheck:\n{healthcheck}\n",
                       control={"timeout_s": control_timeout},
                       checks={"only": ["control", "directories"]},
                       slurm={"timeout_s": scontrol_timeout})


def hc(cluster: SlurmCluster, cfg: str, *args: str, **env: str):
    """One run as slurmd makes it: no arguments but ours, SLURMD_NODENAME set."""
    import subprocess

    full = {"SLURM_CONF": str(cluster.conf), "SLURMD_NODENAME": cluster.node_name,
            "PATH": cluster.env["PATH"], **env}
    return subprocess.run([installed("mps-health-healthcheck"), "--config", cfg, *args],
                          capture_output=True,
                          text=True, timeout=90, env=full)


def node(cluster: SlurmCluster):
    from mps_health.probes.slurm import parse_node_line

    return parse_node_line(cluster.scontrol("show", "node", cluster.node_name, "-o"))


@pytest.fixture
def clean_node(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The node back to IDLE (no reason on 22.05; 24.11 keeps the last), before and after."""
    def reset() -> None:
        v = node(cluster)
        if {"DRAIN", "DOWN"}.intersection(v.flags):
            cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])
        cluster.wait_state(lambda s: s.split("+")[0] == "IDLE" and "DRAIN" not in s, 30)

    reset()
    yield cluster
    reset()


def test_two_failures_drain_with_our_tag_two_clean_runs_resume(clean_node, site) -> None:
    cluster = clean_node
    cfg = write_hc_config(site)
    first = hc(cluster, cfg)  # no daemon at all: control-absent
    assert first.returncode == 2, first.stdout + first.stderr
    assert "failed 1/2" in first.stdout and "before draining" in first.stdout
    assert "DRAIN" not in node(cluster).flags  # one failed run does not drain
    second = hc(cluster, cfg)
    assert second.returncode == 2
    assert "drained (" in second.stdout, second.stdout
    v = node(cluster)
    assert "DRAIN" in v.flags
    assert v.reason.startswith("MPS-HC: control-absent node: ")
    start_daemon(site.pipe, site.log)
    third = hc(cluster, cfg)
    assert third.returncode == 0, third.stdout
    assert "clean run 1 of 2 before resuming" in third.stdout
    assert "DRAIN" in node(cluster).flags
    fourth = hc(cluster, cfg)
    assert "resumed (drained by us" in fourth.stdout, fourth.stdout
    v = node(cluster)
    assert not {"DRAIN", "DOWN"}.intersection(v.flags)
    if cluster.version.split()[-1].startswith("22."):
        assert v.reason == ""
    else:  # 24.11 keeps the last reason after RESUME
        assert v.reason.startswith("MPS-HC: control-absent node: ")
    audit = (site.root / "audit.log").read_text()
    assert "action=healthcheck event=drain result=ok" in audit
    assert "action=healthcheck event=resume result=ok" in audit


def test_a_human_drain_is_never_resumed_nor_overwritten(clean_node, site) -> None:
    cluster = clean_node
    cfg = write_hc_config(site, "  fail_runs: 1\n  pass_runs: 1")
    assert "drained (" in hc(cluster, cfg).stdout  # ours first...
    cluster.scontrol("update", f"NodeName={NODE}", "State=DRAIN", "Reason=swapping a GPU")
    start_daemon(site.pipe, site.log)  # ...then a human takes it over, MPS recovers
    runs = [hc(cluster, cfg) for _ in range(3)]
    assert [r.returncode for r in runs] == [0, 0, 0]
    assert "not resumed: drained by someone else (swapping a GPU): left alone" in runs[0].stdout
    assert "node not drained by us; healthy" in runs[2].stdout
    v = node(cluster)
    assert "DRAIN" in v.flags and v.reason == "swapping a GPU"
    # And a failing check never overwrites the human's reason.
    site.pipe.chmod(0o700)
    for _ in range(2):
        assert hc(cluster, cfg).returncode == 2
    assert node(cluster).reason == "swapping a GPU"


def test_a_node_pending_reboot_is_left_alone(clean_node, site) -> None:
    """(DOWN is judged on captured output in the unit tests: this test cluster's
    ReturnToService=2 brings a DOWN node back within a second.)"""
    cluster = clean_node
    cfg = write_hc_config(site, "  fail_runs: 1")
    job = cluster.start_job(["srun", "sleep", "120"])
    try:
        cluster.wait_running(1)
        cluster.scontrol("reboot", "ASAP", "nextstate=resume", "reason=kernel update", NODE)
        cluster.wait_state(lambda s: "REBOOT_REQUESTED" in s, 30)
        r = hc(cluster, cfg)
        assert r.returncode == 2
        assert "REBOOT_REQUESTED: left to Slurm and the admins" in r.stdout, r.stdout
        assert node(cluster).reason == "kernel update"
        cluster.scontrol("cancel_reboot", NODE)
    finally:
        cluster.cancel_all()
        job.wait(30)


def test_no_slurm_call_when_nothing_changes(clean_node, site) -> None:
    """A counting wrapper stands first for scontrol: healthy runs never call it."""
    cluster = clean_node
    calls = site.root / "scontrol-calls.log"
    wrapper = site.root / "scontrol"
    real = shutil.which("scontrol", path=cluster.env["PATH"])
    wrapper.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = write_hc_config(site)
    Path(cfg).write_text(Path(cfg).read_text().replace(
        "commands:\n", f"commands:\n  scontrol: {wrapper}\n"))
    start_daemon(site.pipe, site.log)
    for _ in range(3):
        assert hc(cluster, cfg).returncode == 0
    # The first run has no saved state: it reads the node once (is it drained by us?).
    assert calls.read_text().splitlines() == [f"show node {NODE} -o"]
    calls.unlink()
    site.pipe.chmod(0o700)  # failing, but Slurm says the node is already out of service
    for _ in range(2):
        r = hc(cluster, cfg, SLURM_NODE_IS_HEALTHY="no")
        assert "failing, and the node is already out of service" in r.stdout or \
            "before draining" in r.stdout
    assert not calls.exists()
    r = hc(cluster, cfg, SLURM_NODE_IS_HEALTHY="yes")  # third failure, node in service
    assert "drained (" in r.stdout
    assert calls.read_text().splitlines() == [
        f"show node {NODE} -o",
        "show node -o",  # the circuit breaker, only when about to drain
        f"update NodeName={NODE} State=DRAIN Reason={node(cluster).reason}"]


def test_slurmctld_down_is_reported_bounded_and_retried(clean_node, site) -> None:
    cluster = clean_node
    cfg = write_hc_config(site, "  fail_runs: 1\n", scontrol_timeout=3)
    cluster.stop_controller()
    try:
        t0 = time.monotonic()
        r = hc(cluster, cfg)
        took = time.monotonic() - t0
    finally:
        cluster.start_controller()
    assert r.returncode == 2
    assert "drain failed, will retry next run" in r.stdout, r.stdout
    assert took < 15
    cluster.wait_state(lambda s: s.startswith("IDLE"), 60)
    again = hc(cluster, cfg)
    assert "drained (" in again.stdout, again.stdout


def test_runs_never_overlap(clean_node, site) -> None:
    cfg = write_hc_config(site)
    held = node_lock(str(site.root / "run"), "healthcheck").acquire(0, "a long run")
    try:
        r = hc(clean_node, cfg)
    finally:
        held.release()
    assert r.returncode == 0
    assert r.stdout.strip() == ("MPS-HC: the previous health check is still running; this run "
                                "is skipped")


def test_detached_answers_at_once_and_refreshes_in_the_background(clean_node,
                                                                  site) -> None:
    cluster = clean_node
    cfg = write_hc_config(site, "  detached: true\n  fail_runs: 5", control_timeout=3.0)
    pid = start_daemon(site.pipe, site.log)
    stop_process(pid)  # every check now waits 3 s for a wedged daemon
    t0 = time.monotonic()
    first = hc(cluster, cfg)
    assert time.monotonic() - t0 < 2.5
    assert first.returncode == 0
    assert "no current result" in first.stdout and "refreshing in the background" in first.stdout
    result = site.root / "run" / RESULT_FILE
    deadline = time.monotonic() + 20
    while not result.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert result.exists()
    t0 = time.monotonic()
    second = hc(cluster, cfg)
    assert time.monotonic() - t0 < 2.5
    assert second.returncode == 2
    assert "control-wedged" in second.stdout and "result from" in second.stdout
    os.kill(pid, signal.SIGCONT)
    wait_for_background_run(site)


def wait_for_background_run(site: Site) -> None:
    """The detached child refreshing the result must be done before the site goes."""
    lock = node_lock(str(site.root / "run"), "healthcheck")
    deadline = time.monotonic() + 30
    while not lock.try_acquire("test teardown") and time.monotonic() < deadline:
        time.sleep(0.2)
    lock.release()


def test_a_result_from_another_boot_is_not_reported(clean_node, site) -> None:
    cfg = write_hc_config(site, "  detached: true")
    start_daemon(site.pipe, site.log)
    (site.root / "run").mkdir(exist_ok=True)
    (site.root / "run" / RESULT_FILE).write_text(
        format_result(2, "another-boot", time.time(), "MPS CRITICAL - from before the reboot"))
    r = hc(clean_node, cfg)
    assert r.returncode == 0
    assert "no current result" in r.stdout and "before the reboot" not in r.stdout
    wait_for_background_run(site)


def test_dry_run_changes_nothing(clean_node, site) -> None:
    cfg = write_hc_config(site, "  fail_runs: 1")
    r = hc(clean_node, cfg, "--dry-run")
    assert r.returncode == 2
    assert "would drain" in r.stdout
    assert "DRAIN" not in node(clean_node).flags
    assert not (site.root / "state" / "healthcheck.state").exists()


@pytest.fixture
def fleet(slurm_where) -> Iterator[SlurmCluster]:
    """A partition of four nodes: ours, and three declared peers no slurmd answers for."""
    c = SlurmCluster(node_name=NODE, peers=PEERS, root=slurm_where).start()
    yield c
    c.stop()


def test_circuit_breaker_holds_the_drain_when_the_partition_is_already_drained(
        fleet: SlurmCluster, site) -> None:
    cluster = fleet
    cfg = write_hc_config(site, "  fail_runs: 1\n  recheck_s: 0\n  fleet_max_share: 0.5")
    for peer in PEERS[:2]:  # 2 of 4: not more than half, the drain goes ahead
        cluster.scontrol("update", f"NodeName={peer}", "State=DRAIN",
                         "Reason=MPS-HC: control-absent node: no daemon")
    r = hc(cluster, cfg)
    assert "drained (" in r.stdout, r.stdout
    cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
    cluster.wait_state(lambda s: "DRAIN" not in s, 30)
    cluster.scontrol("update", f"NodeName={PEERS[2]}", "State=DRAIN",
                     "Reason=MPS-HC: control-absent node: no daemon")
    r = hc(cluster, cfg)  # 3 of 4 already ours: a fleet-wide cause, not this node
    assert r.returncode == 2
    assert "MPS CRITICAL - fleet-wide-fault: fleet-wide fault suspected: 3 of 4 nodes " \
        "of partition debug already drained by MPS-HC:" in r.stdout, r.stdout
    assert "DRAIN" not in node(cluster).flags
    # someone else's drains do not count
    for peer in PEERS:
        cluster.scontrol("update", f"NodeName={peer}", "State=DRAIN", "Reason=rack work")
    assert "drained (" in hc(cluster, cfg).stdout
