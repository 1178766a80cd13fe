"""No real control client outlives a killed check: tests/e2e/test_attack_lifetime.py with
NVIDIA's binaries. A user's real control daemon is stopped, root's check hangs on its
real client, the check is SIGKILLed (by PID, or its process group as slurmd does), in a
private PID namespace; with util-linux's setpriv, and with a stand-in that sets the
parent-death signal only after its parent died (tests/fakes/late_setpriv.c), so the kill
lands between the client's fork and its prctl: the client then reads end-of-file on its
stdin and must exit, not connect and hang.

Run on the GPU node as root: ``python3 -m pytest -m gpu tests/gpu/test_lifetime_gpu.py -v -s``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from hostile import ATTACKER, c_fake, ensure_user, in_namespace, public_dir
from mps_health.hostio import runner
from mpsgpu import Mps, have_gpu, real_control, say
from paths import HELPERS

pytestmark = pytest.mark.gpu
__all__ = ["public_dir"]  # the fixture, used by name

if not have_gpu() or os.geteuid() != 0:
    pytest.skip("needs root, an NVIDIA GPU and the real MPS binaries", allow_module_level=True)


@pytest.mark.parametrize("setpriv", ["setpriv", "late", "late-after-wait"])
@pytest.mark.parametrize("how", ["pid", "group"])
def test_killing_the_check_leaves_no_real_control_client(public_dir: Path, how: str,
                                                         setpriv: str) -> None:
    ensure_user(ATTACKER)
    for name in ("pipe", "log"):
        (public_dir / name).mkdir(mode=0o777)
        (public_dir / name).chmod(0o777)
    late = [str(c_fake("late_setpriv"))] if setpriv.startswith("late") else []
    delay = runner.ARMED_WAIT_S + 0.5 if setpriv == "late-after-wait" else 0.0
    scenario = str(HELPERS / "lifetime_scenario.py")
    r = subprocess.run(in_namespace([sys.executable, scenario, str(public_dir), ATTACKER, how,
                                     *late]),
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LIFETIME_CONTROL": str(real_control()),
                            "LIFETIME_KILL_DELAY_S": str(delay)})
    say(f"{how} kill, {setpriv}: rc {r.returncode} {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["hung_clients"], "the check never started a client: the attack did not happen"
    assert seen["left"] == []



@pytest.mark.parametrize("stdin", ["empty", "held-open"])
def test_real_client_on_a_stopped_daemon(mps: Mps, stdin: str) -> None:
    """What the runner's fence assumes of NVIDIA's client: with its daemon stopped, a
    client whose stdin is at end-of-file exits (the fence's orphan); one whose stdin
    stays open waits (the hang the fence prevents). Both recorded."""
    assert mps.start().returncode == 0
    pid = mps.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        feed = subprocess.DEVNULL if stdin == "empty" else subprocess.PIPE
        client = subprocess.Popen([mps.binary], stdin=feed, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=mps.env)
        try:
            code: Optional[int] = client.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
            client.kill()
            client.wait(timeout=10)
        waited = time.monotonic() - started
        say(f"real client, daemon stopped, stdin {stdin}: "
            f"{f'exited {code}' if code is not None else 'still waiting'} after {waited:.2f} s")
        if stdin == "empty":
            assert code is not None, "the real client waits on an empty stdin"
    finally:
        os.kill(pid, signal.SIGCONT)
