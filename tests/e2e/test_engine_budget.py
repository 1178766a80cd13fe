"""A wedged daemon under a budget shorter than the control timeout is still CRITICAL.

The control source bounds its query by the run's deadline; the engine must wait the
moment it takes to turn the killed query into a fact, or the daemon that hangs every
client would be reported UNKNOWN (facts-unavailable) and the health check would never
drain for it.
"""

import signal
import time

from clirun import mps_health, problem_codes


def test_wedged_daemon_is_critical_when_the_budget_ends_first(site) -> None:
    d = site.start_daemon()
    cfg = site.config("control:\n  timeout_s: 60\n")
    d.signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = mps_health("check", "--config", cfg, "--only", "control", "--budget", "2",
                       "--format", "json")
        took = time.monotonic() - t0
    finally:
        d.signal(signal.SIGCONT)
    codes = problem_codes(r)
    assert r.returncode == 2, r.stdout
    assert codes == ["control-wedged"]
    assert took < 10
