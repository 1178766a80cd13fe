"""Job churn under slurmd's health check: set-up and tear-down are never failures.

A real one-node cluster whose slurm.conf carries the Prolog, TaskProlog, Epilog and
HealthCheck lines `mps-health slurm conf` prints (the fake control daemon stands in
for MPS), HealthCheckInterval 2 s, ``slurm.job_grace_s: 1`` so that jobs running a
little longer are judged too. A job array of JOBS ``--gres=mps:10`` jobs running
``true`` (plus a few running ``sleep`` whose instances are judged healthy) goes
through back to back while slurmd runs the health check. slurmd gives the program no
SLURM_CONF and our config is not /etc/mps-health's, so HealthCheckProgram is a
wrapper that sets both, runs the printed program and logs each run's exit status.

Counted honestly from four places: the wrapper's log (every run and its status),
slurmd's log (a run that fails is logged there; a failed Prolog or Epilog too), our
audit log (every drain), and slurmctld's log (every node drain, and each job's exit
status). The servers source's memory shows that per-job instances were judged. The figures are printed: ``pytest -s -k churn tests/real/test_job_churn.py``.
"""

import json
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from conftest import FIXTURES
from jobhooks import JobHooks, hooks_for_slurm
from paths import FAKE_CONTROL
from slurmcluster import SlurmCluster, SlurmClusterError

pytestmark = pytest.mark.slurm

NODE = "churnnode"
JOBS = 300  # `true`, back to back
SLEEPERS = 6  # `sleep 4`: judged once past the grace
INTERVAL = 2
RECORD = str(FIXTURES / "nvml__HANDWRITTEN_2gpu-test-node.json")
RENDERED = ("prolog", "taskprolog", "epilog", "healthcheckprogram", "healthcheckinterval",
            "healthchecknodestate")


def fake_runs_in(root) -> str:
    """'' when the fake control binary runs in the Slurm root, else what stops it (it
    embeds this machine's libpython, which a Debian 13 root may lack)."""
    import subprocess

    r = subprocess.run(root.wrap([FAKE_CONTROL]), input="", capture_output=True, text=True,
                       timeout=60)
    return r.stderr.strip() if "error while loading shared libraries" in r.stderr else ""


@pytest.fixture(scope="module")
def hooks(slurm_user: str, slurm_where) -> Iterator[JobHooks]:
    why = fake_runs_in(slurm_where) if slurm_where is not None else ""
    if why:
        pytest.skip(f"the fake MPS control binary cannot run in the Slurm 24.11 root: {why}")
    yield from hooks_for_slurm(slurm_user, slurm_where)


def node_config(hooks: JobHooks, cluster: SlurmCluster) -> None:
    """The per-job config of the hooks, with Slurm's real clients and the health check's
    settings: the per-instance checks that need no GPU (not strays, which judges every
    MPS process of the machine: other test sessions' stand-ins are its findings here),
    a 1 s grace, our audit log."""
    # Where slurmd runs the health check (here or in the Slurm root) Slurm's clients
    # are on its PATH: the real squeue in place of the hooks' stand-in.
    hooks.configure(commands={"squeue": "squeue"}, jobs={"log_file": f"{hooks.base}/hooks.log"},
                    checks={"only": ["control", "daemon", "directories", "servers", "orphans"]},
                    slurm={"job_grace_s": 1},
                    # The stand-in daemon is Python: on a loaded two-core machine it may
                    # take a second to answer, which is no MPS fault (control-slow says it
                    # on a node).
                    control={"warn_latency_s": 5},
                    remediation={"audit_log": f"{hooks.base}/audit.log", "syslog": False})


def rendered_lines(hooks: JobHooks) -> Dict[str, str]:
    """`mps-health slurm conf` for this node: the hooks and health check lines."""
    import subprocess

    record = hooks.base / "nvml.json"  # under /tmp: a Slurm root's mps-health sees it too
    shutil.copy(RECORD, record)
    r = subprocess.run([*hooks.mps_health, "slurm", "conf", "--nvml-record", str(record),
                        "--node-name", NODE, "--config", str(hooks.config), "--prefix",
                        str(hooks.hooks), "--health-check-interval", str(INTERVAL)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.lower() in RENDERED:
            lines[key] = value
    assert set(k.lower() for k in lines) == set(RENDERED), r.stdout
    return lines


def wrapper(hooks: JobHooks, cluster: SlurmCluster, program: str) -> Path:
    script = hooks.base / "hc.sh"
    script.write_text(f"""#!/bin/sh
SLURM_CONF={cluster.conf} {program} --config {hooks.config} > {hooks.base}/hc-out.$$ 2>&1
rc=$?
echo "$(date +%s.%N) rc=$rc" >> {hooks.base}/runs.log
if [ $rc -ne 0 ]; then cat {hooks.base}/hc-out.$$ >> {hooks.base}/failed-output.log; fi
cat {hooks.base}/hc-out.$$
rm -f {hooks.base}/hc-out.$$
exit $rc
""")
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def cluster(hooks: JobHooks, slurm_where) -> Iterator[SlurmCluster]:
    c = SlurmCluster(node_name=NODE, root=slurm_where, cpus=8, return_to_service=1)
    node_config(hooks, c)
    lines = rendered_lines(hooks)  # by the node's mps-health (the root's, there)
    program = lines["HealthCheckProgram"]
    c.prolog, c.task_prolog, c.epilog = lines["Prolog"], lines["TaskProlog"], lines["Epilog"]
    c.health_check_program = str(wrapper(hooks, c, program))
    c.health_check_interval = int(lines["HealthCheckInterval"])
    c.health_check_node_state = lines["HealthCheckNodeState"]
    c.extra_conf = ["MaxArraySize=1001"]
    try:
        c.start(timeout=90)
    except SlurmClusterError as e:
        pytest.fail(f"could not start the Slurm test cluster: {e}", pytrace=False)
    yield c
    c.stop()


def runs(hooks: JobHooks) -> List[int]:
    try:
        text = (hooks.base / "runs.log").read_text()
    except OSError:
        return []
    return [int(line.rsplit("rc=", 1)[1]) for line in text.splitlines() if "rc=" in line]


def wait_for(what: str, cond, timeout: float, hooks: JobHooks, cluster: SlurmCluster
             ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    failed = hooks.base / "failed-output.log"
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; runs "
                         f"{runs(hooks)[-10:]}\n"
                         + (failed.read_text()[-2000:] if failed.exists() else "")
                         + cluster.logs())


def test_job_churn_fails_no_health_check_run_and_drains_nothing(cluster: SlurmCluster,
                                                                hooks: JobHooks) -> None:
    wait_for("a first clean health check run", lambda: 0 in runs(hooks), 60, hooks, cluster)
    before = len(runs(hooks))
    slurmd_log = cluster.log_dir / "slurmd.log"
    log_start = slurmd_log.stat().st_size
    t0 = time.monotonic()
    sleepers = cluster.run(["sbatch", f"--array=1-{SLEEPERS}", "--gres=mps:10", "-o",
                            "/dev/null", "--wrap", "sleep 4"], user=hooks.user, timeout=60)
    assert sleepers.returncode == 0, sleepers.stderr
    r = cluster.run(["sbatch", f"--array=1-{JOBS}", "--gres=mps:10", "-o", "/dev/null",
                     "--wrap", "true"], user=hooks.user, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for("every job to finish", lambda: not cluster.job_ids(), 900, hooks, cluster)
    cluster.wait_state(lambda s: s == "IDLE", 120)
    elapsed = time.monotonic() - t0
    # Two more runs after the last job: anything left behind is judged too.
    done = len(runs(hooks))
    wait_for("two more health check runs", lambda: len(runs(hooks)) >= done + 2, 60, hooks, cluster)

    during = runs(hooks)[before:]
    failed = [rc for rc in during if rc != 0]
    ctld = (cluster.log_dir / "slurmctld.log").read_text(errors="replace")
    exits = re.findall(r"_job_complete: JobId=\S+ WEXITSTATUS (\d+)", ctld)
    drains = [x for x in ctld.splitlines() if "MPS-HC" in x and "reason" in x.lower()]
    audit = hooks.base / "audit.log"
    audit_lines = audit.read_text().splitlines() if audit.exists() else []
    slurmd = slurmd_log.read_text(errors="replace")[log_start:]
    hook_errors = [x for x in (hooks.base / "hooks.log").read_text().splitlines()
                   if "error" in x.lower() or "not recorded" in x] if (hooks.base / "hooks.log").exists() else []
    # The servers source remembers each instance it looked at (state_dir/servers.json):
    # per-job instances were judged during the churn, not merely skipped.
    memory = json.loads((hooks.site.state_dir / "servers.json").read_text())
    judged = sorted(name for name in memory if name.startswith("job"))
    print(f"\n{cluster.version}: {len(exits)} jobs ({JOBS} x true, {SLEEPERS} x sleep 4) "
          f"in {elapsed:.0f}s; {len(during)} health check runs, {len(failed)} failed; "
          f"{len(drains)} drains (slurmctld), {len(audit_lines)} audit lines; "
          f"{len(judged)} per-job instances judged")
    if failed:
        print((hooks.base / "failed-output.log").read_text()[-3000:])
    assert len(exits) == JOBS + SLEEPERS and set(exits) == {"0"}, exits[-20:]
    assert len(during) >= 10, f"only {len(during)} health check runs: the test saw no churn"
    assert judged, "no per-job instance was ever judged: the test proves nothing"
    assert failed == [], (hooks.base / "failed-output.log").read_text()[-3000:]
    assert drains == [] and audit_lines == [], (drains, audit_lines)
    assert "health_check failed" not in slurmd and "prolog failed" not in slurmd.lower()
    assert "epilog failed" not in slurmd.lower(), slurmd[-3000:]
    assert hook_errors == [], hook_errors[:5]
    assert "DRAIN" not in cluster.node_state()
    assert hooks.entries() == [] and hooks.processes() == []
