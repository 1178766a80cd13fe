"""No child outlives the run: a user stops their own MPS daemon, root's check hangs on its
control client, and the check is killed (by PID, or its process group as slurmd does).
Run in a private PID namespace so that the clients left behind, if any, are seen there
and end with it.

With util-linux's setpriv, the kill lands wherever it lands; with a stand-in that sets
the parent-death signal only after its parent died (tests/fakes/late_setpriv.c), it
lands, every time, in the window between a client's fork and its prctl; "late-after-wait"
kills only once the runner's own wait for setpriv's exec has given up, as a slow machine
would."""

import json
import os
import sys
from pathlib import Path

import pytest
from hostile import ATTACKER, c_fake, ensure_user, in_namespace, public_dir
from mps_health.hostio import runner
from paths import HELPERS

__all__ = ["public_dir"]  # the fixture, used by name

SCENARIO = str(HELPERS / "lifetime_scenario.py")


@pytest.mark.parametrize("setpriv", ["setpriv", "late", "late-after-wait"])
@pytest.mark.parametrize("how", ["pid", "group"])
def test_killing_the_check_leaves_no_control_client(public_dir: Path, how: str,
                                                    setpriv: str) -> None:
    import subprocess

    ensure_user(ATTACKER)
    late = [str(c_fake("late_setpriv"))] if setpriv.startswith("late") else []
    delay = runner.ARMED_WAIT_S + 0.5 if setpriv == "late-after-wait" else 0.0
    for name in ("pipe", "log"):
        (public_dir / name).mkdir(mode=0o777)
        (public_dir / name).chmod(0o777)
    r = subprocess.run(in_namespace([sys.executable, SCENARIO, str(public_dir), ATTACKER, how, *late]),
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LIFETIME_KILL_DELAY_S": str(delay)})
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["hung_clients"], "the check never started a client: the attack did not happen"
    assert seen["left"] == []
