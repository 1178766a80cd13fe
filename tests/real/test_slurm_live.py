"""gres-drift and orphans against a real Slurm (tests/helpers/slurmcluster.py) and real jobs.

NVML facts are the recorded 2-GPU ones (this machine has no GPU); everything else is
live: scontrol/squeue answers, gres.conf and its device nodes, the fake MPS daemons in
/proc, per-job dirs made by a real Prolog. Each test runs on this machine's Slurm and
on Slurm 24.11 in the Debian 13 root (its clients reached through wrappers on PATH).
"""

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from clirun import mps_health
from conftest import FAKE_CONTROL, fixture_text
from mps_health.config.load import from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.model.facts import Facts
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING
from mps_health.probes.context import Context
from mps_health.probes.jobs import gres_count
from mps_health.probes.nvml import load_record, read_nvml
from mps_health.probes.slurm import parse_gres
from mpsdaemon import start_daemon, stop_process
from slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm
TWO = "nvml__HANDWRITTEN_2gpu-test-node.json"


def recorded_nvml(gpus: int = 2):
    data = json.loads(fixture_text(TWO))
    data["devices"] = data["devices"][:gpus]
    data["device_count"] = gpus
    return read_nvml(load_record(json.dumps(data), TWO))


def gather(cluster: SlurmCluster, tmp_path: Path, extra: Dict[str, Any], gpus: int = 2,
           checks: Tuple[str, ...] = ("gres-drift",)) -> Tuple[Facts, Any]:
    raw = {"node_name": cluster.node_name, "run_dir": str(tmp_path / "run"),
           "state_dir": str(tmp_path / "state"), "slurm": {"timeout_s": 10},
           "commands": cluster.client_commands(),
           "mps": {"pipe_dir": str(tmp_path / "pipe"), "log_dir": str(tmp_path / "log")},
           **extra}
    cfg = from_mapping(raw, "test.yaml")
    needs = [n for c in checks for n in registry.checks()[c].needs if n != "nvml"]
    facts = engine.gather(Context(cfg, "/", time.monotonic() + 30, cluster.env), needs)
    assert facts.errors == {}, facts.errors
    facts.sources["nvml"] = recorded_nvml(gpus)
    return facts, cfg


def verdicts(facts: Facts, cfg: Any, check: str = "gres-drift") -> List[Tuple[str, int, str]]:
    (run,) = engine.judge(facts, cfg, [registry.checks()[check]])
    return [(r.instance, r.state, r.code) for r in run.results]


def bad(results: List[Tuple[str, int, str]]) -> List[Tuple[str, int, str]]:
    return [r for r in results if r[1] != OK]


def node_cfg(d) -> Dict[str, Any]:
    return {"mps": {"pipe_dir": str(d.pipe_dir), "log_dir": str(d.log_dir)}}


def test_consistent_node_with_live_daemon_is_ok(slurm_cluster, site, tmp_path) -> None:
    d = site.start_daemon()
    facts, cfg = gather(slurm_cluster, tmp_path, node_cfg(d))
    results = verdicts(facts, cfg)
    assert bad(results) == []
    assert ("gpu0", OK, "ok") in results and ("gpu1", OK, "ok") in results
    assert facts.sources["slurm"].node.state == "IDLE"


def test_running_mps_job_seen_and_still_ok(slurm_cluster, site, tmp_path,
                                           slurm_user) -> None:
    d = site.start_daemon()
    job = slurm_cluster.start_job(["srun", "--gres=mps:50", "sleep", "60"], user=slurm_user)
    try:
        slurm_cluster.wait_running(1)
        facts, cfg = gather(slurm_cluster, tmp_path, node_cfg(d))
        node = facts.sources["slurm"].node
        assert node.state == "MIXED"
        assert [g.indices for g in node.gres_used if g.name == "mps"] == [(0,)]
        assert bad(verdicts(facts, cfg)) == []
    finally:
        slurm_cluster.cancel_all()
        job.wait(30)


def test_dead_daemon_under_slurm_mps_is_critical(slurm_cluster, site, tmp_path) -> None:
    d = site.start_daemon()
    d.signal(signal.SIGKILL)
    time.sleep(0.1)
    facts, cfg = gather(slurm_cluster, tmp_path, node_cfg(d))
    assert bad(verdicts(facts, cfg)) == [("gpu0", CRITICAL, "mps-gpu-no-daemon"),
                                         ("gpu1", CRITICAL, "mps-gpu-no-daemon")]


def test_lost_gpu_drifts_from_slurm_and_gres_conf(slurm_cluster, site, tmp_path) -> None:
    d = site.start_daemon()
    facts, cfg = gather(slurm_cluster, tmp_path, node_cfg(d), gpus=1)
    found = bad(verdicts(facts, cfg))
    assert ("", CRITICAL, "gres-gpu-count") in found
    assert ("", CRITICAL, "gres-file-minor") in found  # /dev/nvidia1: no GPU has minor 1
    assert ("", WARNING, "gres-mps-count") not in found  # gres.conf still offers 2 x 100


def test_mixed_node_gpu1_unserved(slurm_cluster, site, tmp_path) -> None:
    d = site.start_daemon(name="g0")
    mps = {"layout": "per-gpu", "gpus": [0], "pipe_dir": f"{site.root}/g{{gpu}}-pipe",
           "log_dir": f"{site.root}/g{{gpu}}-log"}
    facts, cfg = gather(slurm_cluster, tmp_path, {"mps": mps})
    assert d.pipe_dir == site.root / "g0-pipe"
    assert bad(verdicts(facts, cfg)) == [("gpu1", CRITICAL, "mps-gpu-unserved")]


def has_json(cluster: SlurmCluster) -> bool:
    """Slurm 23.02 and later answer ``scontrol --json`` (22.05 does not)."""
    major, minor = cluster.version.split()[-1].split(".")[:2]
    return (int(major), int(minor)) >= (23, 2)


def test_one_scontrol_call_per_run(slurm_cluster, site, tmp_path) -> None:
    d = site.start_daemon()
    for run in ("first", "again"):
        facts, _ = gather(slurm_cluster, tmp_path / run, node_cfg(d))
        assert [c.split()[1:] for c in facts.sources["slurm"].calls] == [
            ["-d", "show", "node", slurm_cluster.node_name, "-o"]]


def test_the_text_answer_holds_what_the_json_one_says(slurm_cluster, tmp_path,
                                                     slurm_user) -> None:
    """On one cluster state (an mps job running, the node draining with a reason), the
    one reader gets the state, the reason and the GRES in use; where Slurm answers
    ``--json`` too (23.02+), it says the same of the node."""
    cluster = slurm_cluster
    job = cluster.start_job(["srun", "--gres=mps:50", "sleep", "60"], user=slurm_user)
    try:
        cluster.wait_running(1)
        cluster.scontrol("update", f"NodeName={cluster.node_name}", "State=DRAIN",
                         "Reason=MPS-HC: control-absent node: test")
        cluster.wait_state(lambda s: "DRAIN" in s, 30)
        facts, _ = gather(cluster, tmp_path, {})
        text = facts.sources["slurm"]
        print(cluster.version, "text:", text.node)
        assert text.error is None and text.node is not None
        assert text.node.flags[:2] == ("MIXED", "DRAIN")
        assert text.node.reason.startswith("MPS-HC: control-absent node: test")
        assert any(g.name == "mps" and g.quantity > 0 for g in text.node.gres_used or ())
        if has_json(cluster):
            node = json.loads(cluster.scontrol("--json", "show", "node",
                                               cluster.node_name))["nodes"][0]
            print(cluster.version, "json:", {k: node[k] for k in (
                "state", "reason", "gres", "gres_used")})
            assert [f.upper() for f in node["state"]] == list(text.node.flags)
            assert node["reason"] == text.node.reason
            assert (parse_gres(node["gres"]), parse_gres(node["gres_used"])) == (
                text.node.gres, text.node.gres_used)
    finally:
        cluster.cancel_all()
        job.wait(30)
        cluster.scontrol("update", f"NodeName={cluster.node_name}", "State=RESUME")
        cluster.wait_state(lambda s: s == "IDLE", 30)


# --- per-job MPS with a real Prolog/Epilog --------------------------------------------

PROLOG = """#!/bin/bash
# A plain bash per-job scheme: a job that holds mps gets its own daemon in its own pipe dir.
[ -n "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" ] || exit 0
d={top}/nvidia-mps_job$SLURM_JOB_ID; l={top}/nvidia-log_job$SLURM_JOB_ID
mkdir -p "$d" "$l" && chmod 0777 "$d" "$l"
CUDA_MPS_PIPE_DIRECTORY=$d CUDA_MPS_LOG_DIRECTORY=$l {fake} -d
exit 0
"""
EPILOG = """#!/bin/bash
[ -e {top}/keep ] && exit 0   # a failed epilog: leave everything behind
d={top}/nvidia-mps_job$SLURM_JOB_ID
[ -d "$d" ] || exit 0
echo quit | CUDA_MPS_PIPE_DIRECTORY=$d {fake} >/dev/null
rm -rf "$d" {top}/nvidia-log_job$SLURM_JOB_ID
exit 0
"""


def script(path: Path, text: str, top: Path, python: str) -> str:
    path.write_text(text.format(top=top, python=python, fake=FAKE_CONTROL))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def per_job(make_slurm_cluster, tmp_path, slurm_where):
    # Short: a per-job pipe dir with the largest job id must fit a unix socket path (the
    # config is refused otherwise, as the prologs would refuse it); pytest's are too long.
    # Under /tmp, which the Slurm 24.11 root shares.
    top = Path(tempfile.mkdtemp(prefix="mpsj-", dir="/tmp"))
    top.chmod(0o755)
    python = sys.executable if slurm_where is None else "/usr/bin/python3"  # the root's
    cluster = make_slurm_cluster(node_name="jobnode",
                                 prolog=script(tmp_path / "prolog", PROLOG, top, python),
                                 epilog=script(tmp_path / "epilog", EPILOG, top, python))
    cfg = {"mps": {"layout": "per-job", "pipe_dir": f"{top}/nvidia-mps_job{{job}}",
                   "log_dir": f"{top}/nvidia-log_job{{job}}", "daemon_user": "any",
                   "dir_owner": "root"},  # the prolog above makes root's dirs
           "slurm": {"timeout_s": 10, "job_grace_s": 0}, "orphans": {"min_age_s": 0}}
    yield cluster, top, cfg
    for pid_file in top.glob("nvidia-mps_job*/nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):  # our prolog's daemons
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(top, ignore_errors=True)


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), path


def test_per_job_daemons_drift_and_orphans(per_job, tmp_path, slurm_user) -> None:
    cluster, top, raw = per_job
    job = cluster.start_job(["srun", "--gres=mps:50", "sleep", "120"], user=slurm_user)
    (job_id,) = cluster.wait_running(1)
    pid_file = top / f"nvidia-mps_job{job_id}" / "nvidia-cuda-mps-control.pid"
    wait_for(pid_file)
    time.sleep(0.2)
    checks = ("gres-drift", "orphans")

    facts, cfg = gather(cluster, tmp_path, raw, checks=checks)
    assert len(facts.sources["slurm"].calls) == 2  # scontrol + squeue
    assert bad(verdicts(facts, cfg)) == []
    assert (f"job{job_id}", OK, "ok") in verdicts(facts, cfg)
    assert bad(verdicts(facts, cfg, "orphans")) == []

    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the job's daemon dies
    time.sleep(0.2)
    facts, cfg = gather(cluster, tmp_path, raw, checks=checks)
    assert bad(verdicts(facts, cfg)) == [(f"job{job_id}", CRITICAL, "mps-job-no-daemon")]

    (top / "keep").touch()  # the epilog now fails to clean up
    cluster.cancel_all()
    job.wait(30)
    # Only dirs a Prolog recorded for their job are orphans (hostio/jobrecords.py); this
    # plain bash Prolog records nothing, so the test records what it made, as ours does.
    from mps_health.hostio import jobrecords

    assert jobrecords.add(str(tmp_path / "state"), job_id, 0,
                          [str(top / f"nvidia-mps_job{job_id}"),
                           str(top / f"nvidia-log_job{job_id}")]) == ""
    facts, cfg = gather(cluster, tmp_path, raw, checks=checks)
    assert bad(verdicts(facts, cfg, "orphans")) == [(f"job{job_id}", WARNING, "orphan-dir")]
    (run,) = engine.judge(facts, cfg, [registry.checks()["orphans"]])
    message = run.results[0].message
    assert f"job {job_id} (owner root)" in message and "old" in message

    pid_file.unlink()
    start_daemon(top / f"nvidia-mps_job{job_id}", top / f"nvidia-log_job{job_id}")
    time.sleep(0.2)
    facts, cfg = gather(cluster, tmp_path, raw, checks=checks)
    assert bad(verdicts(facts, cfg, "orphans")) == [(f"job{job_id}", WARNING, "orphan-daemon")]
    # Instances are jobs Slurm runs here: the finished job's daemon is the orphans
    # check's alone, not a second finding of gres-drift.
    assert (f"job{job_id}", WARNING, "mps-daemon-no-job") not in verdicts(facts, cfg)


# --- slurmctld down or hanging: UNKNOWN within the timeout, through the real CLI ----------

def cli_check(cluster: SlurmCluster, config: Path) -> Tuple[int, Dict[str, Any], float]:
    env = dict(cluster.env, SLURMD_NODENAME=cluster.node_name)
    t0 = time.monotonic()
    r = mps_health("check", "--config", str(config), "--only", "gres-drift,orphans",
                   "--format", "json", env=env)
    elapsed = time.monotonic() - t0
    assert r.stderr == "", r.stderr
    return r.returncode, json.loads(r.stdout), elapsed


@pytest.mark.parametrize("how", ["stopped", "hanging"])
def test_slurmctld_down_is_unknown_within_timeout(make_slurm_cluster, site, how) -> None:
    cluster = make_slurm_cluster(node_name="downnode")
    config = Path(site.config(mps={"layout": "per-job", "pipe_dir": f"{site.root}/mps_job{{job}}",
                                   "log_dir": f"{site.root}/log_job{{job}}"},
                              slurm={"timeout_s": 2}))
    rc, report, _ = cli_check(cluster, config)
    codes = {p["code"] for p in report["problems"]}
    assert "slurm-unavailable" not in codes and rc != 2
    ctld = cluster.procs["slurmctld"]
    if how == "stopped":
        cluster.stop_controller()
    else:
        stop_process(ctld.pid)  # accepts connections, never answers
    try:
        rc, report, elapsed = cli_check(cluster, config)
    finally:
        if how == "hanging":
            os.kill(ctld.pid, signal.SIGCONT)
    states = {p["state"] for p in report["problems"]}
    codes = {p["code"] for p in report["problems"]}
    print(f"slurmctld {how}: exit {rc} in {elapsed:.2f}s, problems {sorted(codes)}")
    assert rc == UNKNOWN and states == {"UNKNOWN"}
    # per-job instances are Slurm's jobs here: without squeue no check can judge them
    assert codes == {"facts-unavailable"}
    assert "per-job instances need Slurm's job list: squeue" in report["problems"][0]["message"]
    assert elapsed < 2 + 5  # the 2 s timeout plus interpreter start; never scontrol's own 10 s+


def test_slurm_and_nvml_facts_survive_a_snapshot(per_job, tmp_path, slurm_user) -> None:
    from mps_health.engine.snapshot import dumps, loads

    cluster, top, raw = per_job
    job = cluster.start_job(["srun", "--gres=mps:50", "sleep", "60"], user=slurm_user)
    (job_id,) = cluster.wait_running(1)
    wait_for(top / f"nvidia-mps_job{job_id}" / "nvidia-cuda-mps-control.pid")
    facts, cfg = gather(cluster, tmp_path, raw, checks=("gres-drift", "orphans"))
    assert len(facts.sources["job_dirs"]) == 2
    again, _ = loads(dumps(facts, cfg.raw), "snapshot.json")
    for name in ("slurm", "nvml", "gres_conf", "job_dirs"):
        assert again.sources[name] == facts.sources[name], name
    assert gres_count(again.sources["slurm"].jobs[0], "mps") is not None
    assert verdicts(again, cfg) == verdicts(facts, cfg)
    cluster.cancel_all()
    job.wait(30)


def test_gres_conf_against_slurm_without_nvml(slurm_cluster, site, tmp_path) -> None:
    # No driver (this machine for real): gres.conf is still compared with Slurm's Gres.
    from mps_health.probes.nvml import PynvmlApi

    d = site.start_daemon()
    conf = tmp_path / "gres.conf"
    conf.write_text(f"Name=gpu File={slurm_cluster.devices[0]}\n")
    facts, cfg = gather(slurm_cluster, tmp_path, {**node_cfg(d), "slurm": {
        "timeout_s": 10, "gres_conf": str(conf)}})
    facts.sources["nvml"] = read_nvml(PynvmlApi()) if not shutil.which("nvidia-smi") \
        else read_nvml(load_record(fixture_text("nvml__cpu-vm_no-driver.json"), "x"))
    found = bad(verdicts(facts, cfg))
    assert ("", UNKNOWN, "nvml-unavailable") in found
    assert ("", CRITICAL, "gres-conf-gpu-count") in found
    assert all(state != CRITICAL or code == "gres-conf-gpu-count" for _, state, code in found)
