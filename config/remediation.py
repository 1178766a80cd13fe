"""The ``remediation`` (each step's time, the audit log, a restarted daemon's environment)
and ``healthcheck`` (anti-flap counts, the HealthCheckProgram's budget) config sections.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from mps_health.config.schema import (
    Invalid,
    Record,
    Section,
    custom,
    flag,
    number,
    pathname,
    shown,
    text,
    whole,
)
from mps_health.config.slurm import SlurmSettings
from mps_health.model.results import BOOT_GRACE_S

# slurmd kills HealthCheckProgram after 60 s (HealthCheckTimeout from Slurm 26.05).
SLURMD_KILL_S = 60.0
# A run slower than this is a WARNING (healthcheck-slow): it is on its way to the kill.
SLOW_RUN_S = SLURMD_KILL_S / 4
# A run that drains reads the node, reads every node (the circuit breaker), then drains.
SLURM_CALLS = 3


def _env(value: Any) -> Tuple[Tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise Invalid("must be a mapping of variable names to strings")
    for name, val in value.items():
        if not isinstance(name, str) or not name.isidentifier() or \
                not isinstance(val, (str, int, float)) or isinstance(val, bool) or \
                "\0" in str(val):
            raise Invalid(f"must map a variable name to a string (got {shown(val)})", str(name))
    return tuple((str(k), str(v)) for k, v in sorted(value.items()))


class RemediationSettings(Record):
    quit_timeout_s: float = number(10.0, 0.0, 600.0)  # 'quit -t N': servers alive then die
    term_timeout_s: float = number(5.0, 0.1, 600.0)  # SIGTERM, then SIGKILL after this
    verify_timeout_s: float = number(15.0, 0.5, 600.0)  # a restarted daemon answers within
    lock_wait_s: float = number(30.0, 0.0, 3600.0)  # a second remediation waits this long
    audit_log: str = pathname("/var/log/mps-health/audit.log")
    syslog: bool = flag(True)
    daemon_env: Tuple[Tuple[str, str], ...] = custom((), _env)  # for restarted daemons
    # No second reset of the node (any of its instances) within this long of the last one
    # that acted (hostio/planned.py): a fault a restart does not cure must not cost every job
    # a restart per run. --force overrides it for a manual reset, never an --automatic one.
    # At most planned.KEEP_S (7 days), older records are not kept. 0: no cooldown.
    cooldown_s: float = number(1800.0, 0.0, 7 * 86400.0)


class HealthcheckSettings(Record):
    fail_runs: int = whole(2, 1, 100)  # failed runs in a row before draining
    pass_runs: int = whole(2, 1, 100)  # clean runs in a row before resuming our own drain
    timeout_s: float = number(45.0, 2.0, 3600.0)  # the whole run, Slurm calls included
    drain_on: str = text("critical", choices=("critical", "warning"))  # least failing state
    detached: bool = flag(False)  # answer at once with the last result, check in background
    result_ttl_s: float = number(900.0, low=1.0)  # an older detached result is not reported
    recheck_s: float = number(600.0)  # while failing and drained by us, re-read the node
    # Circuit breaker: do not drain when more than this share, or this number, of the
    # nodes of this node's partitions already carry our drain tag (a fleet-wide cause).
    fleet_max_share: float = number(0.5, 0.0, 1.0)  # 1.0: no limit by share
    fleet_max_nodes: Optional[int] = whole(None, 0, 1_000_000, optional=True)  # null: none
    # For this long after boot a unit that has not come up yet (results.STARTING_CODES)
    # is reported as starting, not as a fault: a booting node is not drained. 0: off.
    boot_grace_s: float = number(BOOT_GRACE_S, 0.0, 86400.0)
    # Free a daemon a local process holds (checks/blockers.py) within the run, as
    # 'mps-health remediate unblock' does: the node heals and stays in service.
    unblock: bool = flag(True)


def _finish_healthcheck(hc: HealthcheckSettings, given: Mapping[str, Any],
                        loaded: Mapping[str, Record]) -> HealthcheckSettings:
    slurm = loaded.get("slurm")
    scontrol = slurm.timeout_s if isinstance(slurm, SlurmSettings) else SlurmSettings.timeout_s
    if hc.timeout_s < SLURM_CALLS * scontrol + 2:
        got = f"got {hc.timeout_s:g}" if "timeout_s" in given else \
            f"the default {hc.timeout_s:g}: set it, or lower slurm.timeout_s"
        raise Invalid(f"must leave room for the checks and {SLURM_CALLS} scontrol calls: at "
                      f"least {SLURM_CALLS} x slurm.timeout_s + 2 = "
                      f"{SLURM_CALLS * scontrol + 2:g} ({got})", "timeout_s")
    return hc


REMEDIATION = Section("remediation", RemediationSettings)
HEALTHCHECK = Section("healthcheck", HealthcheckSettings, _finish_healthcheck)
SECTIONS = (REMEDIATION, HEALTHCHECK)
remediation = REMEDIATION.of
healthcheck = HEALTHCHECK.of
