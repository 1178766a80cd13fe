"""slurmd itself runs the installed ``mps-health-healthcheck`` every 5 s.

On this machine's Slurm (22.05, this checkout's mps-health) and on Slurm 24.11 in the
Debian 13 root, where slurmd runs the root's installed mps-health. slurmd gives the program only SLURMD_NODENAME (and PWD): no PATH, no SLURM_CONF. On a
real node neither is needed (scontrol reads /etc/slurm/slurm.conf, mps-health reads
/etc/mps-health/config.yaml); this private cluster's slurm.conf and our test config
are elsewhere, so HealthCheckProgram is a two-line wrapper that sets SLURM_CONF and
passes --config, logging each run's start and end so the test can count runs.
"""


import contextlib
import os
import signal
import time
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

import pytest
from clirun import installed
from mps_health.healthcheck import state as hcstate
from mps_health.probes.slurm import SlurmNode, parse_node_line
from mpsdaemon import start_daemon, stop_process
from nodesite import Site
from remhelp import remediating
from slurmcluster import SlurmCluster
from slurmroot import VENV

pytestmark = pytest.mark.slurm

NODE = "hcdnode"
INTERVAL = 5


class Setup(NamedTuple):
    cluster: SlurmCluster
    site: Site
    cfg: str


def configure(site: Site, control_timeout: float = 1.0, hc: str = "",
              scontrol_timeout: float = 5.0, **sections: Any) -> str:
    # boot_grace_s 0: a machine booted minutes ago must not excuse the faults made here.
    return site.config(remediating(site), f"healthcheck:\n  boot_grace_s: 0\n{hc}\n",
                       control={"timeout_s": control_timeout},
                       checks={"only": ["control", "directories"]},
                       slurm={"timeout_s": scontrol_timeout}, **sections)


@pytest.fixture(scope="module")
def setup(slurm_where) -> Iterator[Setup]:
    site = Site.create(prefix="mpsh-hcd-")
    base = site.root
    site.dirs()
    cfg = configure(site)
    script = base / "hc.sh"
    # ReturnToService=1: a node an admin set DOWN stays DOWN (2 would return it).
    cluster = SlurmCluster(node_name=NODE, health_check_program=str(script),
                           health_check_interval=INTERVAL, return_to_service=1,
                           root=slurm_where)
    exe = installed("mps-health-healthcheck") if slurm_where is None else f"{VENV}/bin/mps-health-healthcheck"
    script.write_text(f"""#!/bin/sh
echo "start $$ $(date +%s.%N)" >> {base}/runs.log
env > {base}/hc-env.txt
SLURM_CONF={cluster.conf} {exe} --config {cfg} > {base}/last-output.txt 2>&1
rc=$?
echo "end $$ $(date +%s.%N) rc=$rc" >> {base}/runs.log
cat {base}/last-output.txt
exit $rc
""")
    script.chmod(0o755)
    start_daemon(site.pipe, site.log)
    try:
        cluster.start(timeout=90)
        yield Setup(cluster, site, cfg)
    finally:
        cluster.stop()
        site.close()


def node(s: Setup) -> SlurmNode:
    return parse_node_line(s.cluster.scontrol("show", "node", NODE, "-o"))


def runs(s: Setup) -> List[Tuple[str, str, float, str]]:
    """(event, pid, time, rc) for each line the wrapper logged."""
    out = []
    try:
        lines = (s.site.root / "runs.log").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        f = line.split()
        out.append((f[0], f[1], float(f[2]), f[3] if len(f) > 3 else ""))
    return out


def ended(s: Setup) -> int:
    return sum(1 for r in runs(s) if r[0] == "end")


def wait_for(what: str, cond: Callable[[], bool], timeout: float,
             s: Optional[Setup] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    detail = ""
    if s is not None:  # what slurmd and our runs did meanwhile
        with contextlib.suppress(OSError):
            detail = ("\nlast runs: " + repr(runs(s)[-6:]) + "\nlast output:\n"
                      + (s.site.root / "last-output.txt").read_text() + "\n" + s.cluster.logs())
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{detail}")


def resume_if_drained(s: Setup) -> None:
    if "DRAIN" in node(s).flags:
        s.cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")


def reset(s: Setup):
    """``mps-health remediate reset`` by the node's own mps-health (the root's, there)."""
    import subprocess

    return subprocess.run([*s.cluster.mps_health_argv(), "remediate", "reset", "--config",
                           s.cfg], capture_output=True, text=True, timeout=120)


def state(s: Setup) -> hcstate.HcState:
    return hcstate.load(str(s.site.root / "state" / hcstate.STATE_FILE))


def test_slurmd_gives_the_program_almost_no_environment(setup: Setup) -> None:
    wait_for("a health check run", lambda: ended(setup) >= 1, 30)
    env = dict(line.split("=", 1) for line in
               (setup.site.root / "hc-env.txt").read_text().splitlines() if "=" in line)
    print(f"HealthCheckProgram environment from {setup.cluster.version}:", sorted(env))
    assert env["SLURMD_NODENAME"] == NODE
    assert "PATH" not in env and "SLURM_CONF" not in env


def test_fault_drains_fix_resumes_human_drain_stays(setup: Setup) -> None:
    s = setup
    wait_for("a clean run", lambda: any(r[3] == "rc=0" for r in runs(s)), 30)
    assert "DRAIN" not in node(s).flags
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    t_fault = time.monotonic()
    os.kill(daemon, signal.SIGKILL)  # a stale pipe dir: every client silently loses MPS
    seen_one = []

    def one_failure_not_drained() -> bool:
        st = state(s)
        if st.fails == 1:
            seen_one.append(node(s))
            return True
        return False

    wait_for("the first failed run", one_failure_not_drained, 30)
    assert "DRAIN" not in seen_one[0].flags, "drained after a single failed run"
    wait_for("the drain", lambda: "DRAIN" in node(s).flags, 30)
    drained_after = time.monotonic() - t_fault
    v = node(s)
    print(f"drained {drained_after:.1f}s after the fault: State={v.state} Reason={v.reason}")
    assert v.reason.startswith("MPS-HC: control-absent node: ")
    # Fix it the supported way, then slurmd's runs resume the node (two clean runs).
    r = reset(s)
    assert r.returncode == 0, r.stdout + r.stderr
    t_fix = time.monotonic()
    wait_for("the resume", lambda: "DRAIN" not in node(s).flags, 40)
    print(f"resumed {time.monotonic() - t_fix:.1f}s after the reset")
    v = node(s)
    if s.cluster.version.split()[-1].startswith("22."):
        assert v.reason == ""
    else:  # 24.11 keeps the last reason after RESUME (and `Reason=` does not clear it)
        assert v.reason.startswith("MPS-HC: control-absent node: ")
    assert not set(v.flags) & {"DRAIN", "DOWN"}
    # A human drains it with a reason of their own: our clean runs never resume it.
    s.cluster.scontrol("update", f"NodeName={NODE}", "State=DRAIN",
                       "Reason=hands off: GPU swap")
    before = ended(s)
    wait_for("three more runs", lambda: ended(s) >= before + 3, 40)
    v = node(s)
    assert "DRAIN" in v.flags and v.reason == "hands off: GPU swap"
    resume_if_drained(s)


def test_a_hanging_check_is_not_killed_by_slurmd(setup: Setup) -> None:
    """The control client would wait 60 s on a stopped daemon (slurmd kills at 60 s); our
    budget (healthcheck.timeout_s 18: 8 s of checks after three 3-s scontrol calls) ends
    each run well before."""
    s = setup
    configure(s.site, control_timeout=60.0, hc="  timeout_s: 18", scontrol_timeout=3,
              budget_s=300)
    wait_for("the node in service", lambda: "DRAIN" not in node(s).flags, 20)
    wait_for("our state to forget the last drain", lambda: not state(s).drained, 40)
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    log_before = (s.cluster.log_dir / "slurmd.log").read_text()
    stop_process(daemon)
    try:
        first = len(runs(s))
        wait_for("the drain", lambda: "DRAIN" in node(s).flags, 90, s)
        v = node(s)
        print(f"State={v.state} Reason={v.reason}")
        assert v.reason.startswith("MPS-HC: control-wedged node: ")
        log = (s.cluster.log_dir / "slurmd.log").read_text()[len(log_before):]
        assert "health_check poll timeout" not in log and "killed by signal" not in log, log
        starts = {r[1]: r[2] for r in runs(s)[first:] if r[0] == "start"}
        spans = [r[2] - starts[r[1]] for r in runs(s)[first:] if r[0] == "end"
                 and r[1] in starts]
        print("run durations with a wedged daemon:", [f"{x:.1f}s" for x in spans])
        assert spans and max(spans) < 20
        # slurmd starts a run every 5 s even while one is going: ours take turns, and a
        # run that finds the lock taken answers at once (exit 0) instead of piling up.
        ends = [r for r in runs(s)[first:] if r[0] == "end"]
        skipped = [r for r in ends if r[3] == "rc=0" and r[2] - starts.get(r[1], 0) < 3]
        print(f"{len(ends)} runs ended, {len(skipped)} skipped while another ran")
        assert skipped
    finally:
        os.kill(daemon, signal.SIGCONT)
        resume_if_drained(s)


def test_detached_mode_answers_slurmd_at_once_and_the_child_survives(setup: Setup) -> None:
    """slurmd kills the program's process group once it exits: the detached child, in a
    session of its own, still finishes, writes the result and drains the node."""
    from mps_health.healthcheck.detach import RESULT_FILE, read_result

    s = setup
    configure(s.site, control_timeout=3.0, hc="  detached: true")
    resume_if_drained(s)
    wait_for("the node in service", lambda: "DRAIN" not in node(s).flags, 20)
    # After a drain of ours was lifted by hand, a clean run or two tell us it is over.
    wait_for("our state to forget the last drain", lambda: not state(s).drained, 40)
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    result = s.site.root / "run" / RESULT_FILE
    first = len(runs(s))
    stop_process(daemon)
    try:
        wait_for("the drain", lambda: "DRAIN" in node(s).flags, 60, s)
        v = node(s)
        print(f"detached: State={v.state} Reason={v.reason}")
        assert v.reason.startswith("MPS-HC: control-wedged node: ")
        stored = read_result(str(result))
        assert stored is not None and stored.rc == 2
        starts = {r[1]: r[2] for r in runs(s)[first:] if r[0] == "start"}
        spans = [r[2] - starts[r[1]] for r in runs(s)[first:] if r[0] == "end"
                 and r[1] in starts]
        print("detached answers to slurmd took:", [f"{x:.2f}s" for x in spans])
        assert spans and max(spans) < 2.5  # the checks themselves take over 3 s
    finally:
        os.kill(daemon, signal.SIGCONT)
        configure(s.site)
        resume_if_drained(s)


def test_a_down_node_is_left_alone(setup: Setup) -> None:
    """An admin's DOWN (with a broken MPS) is neither drained over nor resumed."""
    s = setup
    configure(s.site)
    resume_if_drained(s)
    wait_for("the node in service", lambda: "DRAIN" not in node(s).flags, 20)
    wait_for("our state to forget the last drain", lambda: not state(s).drained, 40)
    s.cluster.scontrol("update", f"NodeName={NODE}", "State=DOWN", "Reason=hands off: cabling")
    try:
        s.cluster.wait_state(lambda st: "DOWN" in st, 30)
        daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
        os.kill(daemon, signal.SIGKILL)
        before = ended(s)
        wait_for("three runs on the DOWN node", lambda: ended(s) >= before + 3, 40)
        v = node(s)
        output = (s.site.root / "last-output.txt").read_text()
        print(f"DOWN: State={v.state} Reason={v.reason}; last run: {output.strip()}")
        assert "DOWN" in v.flags and "DRAIN" not in v.flags
        assert v.reason == "hands off: cabling"
        assert "left to Slurm and the admins" in output
    finally:
        reset(s)
        s.cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
