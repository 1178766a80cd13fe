"""Real slurmd runs the installed ``mps-health-healthcheck`` (HealthCheckProgram, every
5 s) while slurmctld freezes, and while the node is booting.

slurmd starts no health check while slurmctld is stopped (slurmctld asks for them), so
slurmctld is frozen (SIGSTOP) while a run slurmd started is in flight: one whose control
query waits on a wedged (or slow) fake daemon, so that it lasts seconds. That run's
scontrol call hangs until ``slurm.timeout_s``; the run must end within its bound (slurmd
does not kill it), drain or resume nothing, and keep what it owes in the state file;
after SIGCONT a later run does it. And a node within ``healthcheck.boot_grace_s`` of its
boot whose MPS dirs and daemon are not there yet is not drained by slurmd's runs, while
the same fault with no grace is (the control).

On this machine's Slurm (22.05, this checkout's mps-health) and on Slurm 24.11 in the
Debian 13 root (the root's installed mps-health), as tests/real/test_healthcheck_slurmd.py.
"""

import contextlib
import os
import shutil
import signal
import time
from typing import Callable, Iterator, List, NamedTuple, Optional, Tuple

import pytest
from clirun import installed
from mps_health.healthcheck import state as hcstate
from mps_health.probes.slurm import SlurmNode, parse_node_line
from mpsdaemon import start_daemon, stop_process
from nodesite import Site
from remhelp import kill_and_wait, remediating
from slurmcluster import SlurmCluster
from slurmroot import VENV

pytestmark = pytest.mark.slurm

NODE = "hcfnode"
INTERVAL = 5
CONTROL_TIMEOUT = 3.0  # a wedged daemon's query takes this: the run's window
SCONTROL_TIMEOUT = 2.0  # each scontrol call of a drain or resume
HC_TIMEOUT = 18.0  # healthcheck.timeout_s: the run's own bound
# A run with a wedged daemon: its checks (one control query), then one scontrol call
# that hangs (the node's read, before any drain or resume: nothing is sent after it).
# slurm.timeout_s x 3 calls as the bound, and a margin for Python and this machine.
RUN_BOUND = CONTROL_TIMEOUT + 3 * SCONTROL_TIMEOUT + 4.0


class Setup(NamedTuple):
    cluster: SlurmCluster
    site: Site


def configure(site: Site, grace_s: float = 0.0) -> str:
    return site.config(remediating(site),
                       healthcheck={"boot_grace_s": grace_s, "timeout_s": HC_TIMEOUT,
                                    "fail_runs": 2, "pass_runs": 2},
                       # warn_latency_s: the slow daemon of the resume is clean, not slow.
                       control={"timeout_s": CONTROL_TIMEOUT, "warn_latency_s": 10.0},
                       checks={"only": ["control", "directories"]},
                       slurm={"timeout_s": SCONTROL_TIMEOUT})


@pytest.fixture(scope="module")
def setup(slurm_where) -> Iterator[Setup]:
    site = Site.create(prefix="mpsh-hcf-")
    base = site.root
    site.dirs()
    cfg = configure(site)
    script = base / "hc.sh"
    cluster = SlurmCluster(node_name=NODE, health_check_program=str(script),
                           health_check_interval=INTERVAL, return_to_service=1,
                           root=slurm_where)
    exe = installed("mps-health-healthcheck") if slurm_where is None \
        else f"{VENV}/bin/mps-health-healthcheck"
    # slurmd gives the program no PATH and no SLURM_CONF: the wrapper sets SLURM_CONF and
    # passes --config, and logs each run's start and end (its own PID) for the test.
    script.write_text(f"""#!/bin/sh
echo "start $$ $(date +%s.%N)" >> {base}/runs.log
SLURM_CONF={cluster.conf} {exe} --config {cfg} > {base}/out.$$ 2>&1
rc=$?
echo "end $$ $(date +%s.%N) rc=$rc" >> {base}/runs.log
cat {base}/out.$$
exit $rc
""")
    script.chmod(0o755)
    start_daemon(site.pipe, site.log)
    try:
        cluster.start(timeout=90)
        yield Setup(cluster, site)
    finally:
        ctld = cluster.procs.get("slurmctld")
        if ctld is not None:  # never leave it stopped, whatever failed
            with contextlib.suppress(OSError):
                os.kill(ctld.pid, signal.SIGCONT)
        cluster.stop()
        site.close()


# --- what slurmd, Slurm and our runs did ------------------------------------------------

def node(s: Setup) -> SlurmNode:
    return parse_node_line(s.cluster.scontrol("show", "node", NODE, "-o"))


def runs(s: Setup) -> List[Tuple[str, int, float, str]]:
    """(event, wrapper PID, time, rc) for each line the wrapper logged."""
    out = []
    with contextlib.suppress(OSError):
        for line in (s.site.root / "runs.log").read_text().splitlines():
            f = line.split()
            out.append((f[0], int(f[1]), float(f[2]), f[3] if len(f) > 3 else ""))
    return out


def output_of(s: Setup, wrapper: int) -> str:
    return (s.site.root / f"out.{wrapper}").read_text()


def state(s: Setup) -> hcstate.HcState:
    return hcstate.load(str(s.site.state_dir / hcstate.STATE_FILE))


def wait_for(what: str, cond: Callable[[], bool], timeout: float, s: Setup) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\nlast runs: "
                         f"{runs(s)[-6:]!r}\nstate: {state(s)!r}\n{s.cluster.logs()}")


def _stat(pid: int) -> Tuple[str, int]:
    """(comm, parent PID) of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    comm = text[text.index("(") + 1:text.rindex(")")]
    return comm, int(text[text.rindex(")") + 2:].split()[1])


def in_flight(s: Setup) -> Optional[Tuple[int, int]]:
    """(PID, wrapper PID) of an ``mps-health-healthcheck`` that slurmd started (its
    wrapper's parent is this cluster's slurmd), or None."""
    slurmd = s.cluster.procs["slurmd"].pid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not any(a.endswith(b"/mps-health-healthcheck") for a in argv):
                continue
            _, wrapper = _stat(pid)
            _, parent = _stat(wrapper)
        except (OSError, ValueError):
            continue
        if parent == slurmd:
            return pid, wrapper
    return None


def alive(pid: int) -> bool:
    """``pid`` runs (it exists and is no zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ctld_pid(s: Setup) -> int:
    pid = s.cluster.procs["slurmctld"].pid
    assert _stat(pid)[0] == "slurmctld", "the Popen is not slurmctld itself"
    return pid


def freeze_during_next_run(s: Setup, ready: Callable[[hcstate.HcState], bool]) -> int:
    """Once ``ready(state)`` holds and no run is in flight, wait for the next run slurmd
    starts and SIGSTOP slurmctld while it is in flight; return its wrapper's PID once the
    run ended, with slurmctld still frozen (the caller sends SIGCONT)."""
    wait_for("the state before the run to catch", lambda: ready(state(s))
             and in_flight(s) is None, 60, s)
    found: List[Tuple[int, int]] = []

    def started() -> bool:
        now = in_flight(s)
        if now is not None:
            found.append(now)
        return now is not None

    wait_for("a run started by slurmd", started, 3 * INTERVAL, s)
    pid, wrapper = found[-1]
    stop_process(ctld_pid(s))
    assert alive(pid), "the run ended before slurmctld was frozen: too quick to catch"
    wait_for("the run to end with slurmctld frozen", lambda: any(
        r[0] == "end" and r[1] == wrapper for r in runs(s)), HC_TIMEOUT + 10, s)
    return wrapper


def span(s: Setup, wrapper: int) -> Tuple[float, str]:
    """How long the wrapper's run took (by its own log), and its exit."""
    start = [r[2] for r in runs(s) if r[0] == "start" and r[1] == wrapper]
    end = [(r[2], r[3]) for r in runs(s) if r[0] == "end" and r[1] == wrapper]
    assert start and end, runs(s)
    return end[0][0] - start[0], end[0][1]


def in_service(s: Setup) -> None:
    """The node IDLE and not drained, our state clean (the tests' start)."""
    configure(s.site)
    if "DRAIN" in node(s).flags:
        s.cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
    wait_for("the node in service", lambda: "DRAIN" not in node(s).flags, 30, s)
    wait_for("a clean state", lambda: not state(s).drained and state(s).fails == 0, 40, s)


def slurmd_log(s: Setup) -> str:
    return (s.cluster.log_dir / "slurmd.log").read_text()


# --- the tests ------------------------------------------------------------------------

def test_a_drain_owed_while_slurmctld_is_frozen_is_done_after_it_thaws(setup: Setup) -> None:
    s = setup
    in_service(s)
    log_before = len(slurmd_log(s))
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    stop_process(daemon)  # wedged: each run's control query takes its timeout
    ctld = ctld_pid(s)
    try:
        # One failed run counted (fail_runs 2): the next run drains, and it is the one
        # caught with slurmctld frozen.
        wrapper = freeze_during_next_run(s, lambda st: st.fails == 1)
        took, rc = span(s, wrapper)
        output = output_of(s, wrapper)
        st = state(s)
        print(f"{s.cluster.version}: the run with slurmctld frozen took {took:.1f}s "
              f"({rc}; state {st.duration_s:.1f}s):\n{output}")
        assert took < RUN_BOUND and st.duration_s < RUN_BOUND
        assert "MPS UNKNOWN - healthcheck-slurm-failed: the drain was not done" in output
        assert "control-wedged" in output
        # Owed, not done: the failures counted, no drain of ours recorded.
        assert st.fails >= 2 and not st.drained
        # While frozen, slurmd starts no other run (printed, not relied on).
        time.sleep(2 * INTERVAL)
        end_at = next(r[2] for r in runs(s) if r[0] == "end" and r[1] == wrapper)
        later = [r for r in runs(s) if r[0] == "start" and r[2] > end_at]
        print(f"runs slurmd started in the {2 * INTERVAL}s slurmctld stayed frozen after "
              f"that run: {len(later)}")
    finally:
        os.kill(ctld, signal.SIGCONT)
    # The frozen run's read never reached slurmctld as a drain: not drained now, before
    # a later run (one with a wedged daemon takes over CONTROL_TIMEOUT) can drain it.
    v = node(s)
    print(f"right after SIGCONT: State={v.state} Reason={v.reason}")
    assert "DRAIN" not in v.flags
    # A later run does what is owed.
    wait_for("the owed drain", lambda: "DRAIN" in node(s).flags, 40, s)
    v = node(s)
    assert v.reason.startswith("MPS-HC: control-wedged node: "), v.reason
    wait_for("the drain in our state", lambda: state(s).drained, 20, s)
    log = slurmd_log(s)[log_before:]
    assert "health_check poll timeout" not in log and "killed by signal" not in log, log

    # The resume direction: fixed (a daemon that answers, slowly: the clean run lasts
    # seconds), slurmctld frozen during the run that would resume.
    os.kill(daemon, signal.SIGCONT)
    kill_and_wait(daemon)
    start_daemon(s.site.pipe, s.site.log, env={"FAKE_MPS_DELAY": "2"})
    wrapper = freeze_during_next_run(s, lambda st: st.drained and st.passes == 1)
    try:
        took, rc = span(s, wrapper)
        output = output_of(s, wrapper)
        st = state(s)
        print(f"{s.cluster.version}: the resuming run with slurmctld frozen took "
              f"{took:.1f}s ({rc}):\n{output}")
        assert took < RUN_BOUND and st.duration_s < RUN_BOUND
        assert "MPS UNKNOWN - healthcheck-slurm-failed: the resume was not done" in output
        assert st.drained and st.passes >= 2  # the resume is owed, not lost
    finally:
        os.kill(ctld, signal.SIGCONT)
    v = node(s)
    print(f"right after SIGCONT: State={v.state} Reason={v.reason}")
    assert "DRAIN" in v.flags  # nothing was resumed by the frozen run
    wait_for("the owed resume", lambda: "DRAIN" not in node(s).flags, 40, s)
    wait_for("the resume in our state", lambda: not state(s).drained, 20, s)
    log = slurmd_log(s)[log_before:]
    assert "health_check poll timeout" not in log and "killed by signal" not in log, log
    # Back to a daemon that answers at once, for the next test.
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    kill_and_wait(daemon)
    start_daemon(s.site.pipe, s.site.log)


def test_a_booting_node_within_its_grace_is_not_drained(setup: Setup) -> None:
    s = setup
    in_service(s)
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    if uptime > 86400 - 600:
        pytest.skip(f"up {uptime:.0f}s: more than the longest boot grace (86400 s)")
    grace = min(86400.0, uptime + 3600.0)
    # What a node looks like before its MPS unit ran: no daemon, no pipe or log dir.
    daemon = int((s.site.pipe / "nvidia-cuda-mps-control.pid").read_text())
    configure(s.site, grace_s=grace)
    kill_and_wait(daemon)
    shutil.rmtree(s.site.pipe)
    shutil.rmtree(s.site.log)
    try:
        first = len([r for r in runs(s) if r[0] == "end"])
        wait_for("four runs within the grace", lambda: len(
            [r for r in runs(s) if r[0] == "end"]) >= first + 4, 40, s)
        last = [r for r in runs(s) if r[0] == "end"][-1]
        output = output_of(s, last[1])
        v = node(s)
        st = state(s)
        print(f"{s.cluster.version}: booted {uptime:.0f}s ago, grace {grace:.0f}s: "
              f"State={v.state} Reason={v.reason}; last run ({last[3]}):\n{output}")
        assert "DRAIN" not in v.flags
        assert "INITIALIZING - booted" in output and "never drained" in output
        assert st.fails == 0 and not st.drained
        # The control: the same fault with no grace drains.
        configure(s.site, grace_s=0.0)
        wait_for("the drain without the grace", lambda: "DRAIN" in node(s).flags, 40, s)
        v = node(s)
        print(f"no grace: State={v.state} Reason={v.reason}")
        assert v.reason.startswith("MPS-HC: "), v.reason
    finally:
        configure(s.site)
        s.site.dirs()
        start_daemon(s.site.pipe, s.site.log)
    wait_for("the resume once MPS is up", lambda: "DRAIN" not in node(s).flags, 40, s)
