"""The config sections remediation and the Slurm health check read, checked key by key.

``remediation:`` sets how long each step of a reset may take, where the audit log goes
and what extra environment a restarted daemon gets. ``healthcheck:`` sets the drain
tag, the anti-flap counts and the time budget of the HealthCheckProgram run. Errors
use the core's one-line style: "FILE: key 'a.b': what is wrong".
"""

from typing import Mapping, NamedTuple, Tuple

from mps_health.config import Config, ConfigError, _Validator

DEFAULT_AUDIT_LOG = "/var/log/mps-health/audit.log"
# slurmd kills HealthCheckProgram after 60 s (HealthCheckTimeout from Slurm 26.05).
SLURMD_KILL_S = 60.0


class RemediationSettings(NamedTuple):
    quit_timeout_s: float = 10.0  # N of 'quit -t N': servers still alive then are killed
    term_timeout_s: float = 5.0  # SIGTERM, then SIGKILL after this
    verify_timeout_s: float = 15.0  # a restarted daemon must answer within this
    lock_wait_s: float = 30.0  # a second remediation waits this long for the node lock
    audit_log: str = DEFAULT_AUDIT_LOG
    syslog: bool = True
    daemon_env: Tuple[Tuple[str, str], ...] = ()  # extra environment for restarted daemons
    orphan_min_age_s: float = 120.0  # younger per-job dirs may belong to a job being set up


class HealthcheckSettings(NamedTuple):
    tag: str = "MPS-HC:"  # first word of our drain reasons; only such drains are resumed
    fail_runs: int = 2  # failed runs in a row before draining
    pass_runs: int = 2  # clean runs in a row before resuming our own drain
    timeout_s: float = 45.0  # the whole run, Slurm calls included; below slurmd's 60 s
    scontrol_timeout_s: float = 5.0  # each scontrol call
    drain_on: str = "critical"  # "critical" or "warning": the least state that fails a run
    detached: bool = False  # answer at once with the last result, check in the background
    result_ttl_s: float = 900.0  # a detached result older than this is not reported
    recheck_s: float = 600.0  # while failing and drained by us, re-read the node this often


def remediation(config: Config) -> RemediationSettings:
    section = config.section("remediation")
    v = _Validator(config.path or "<defaults>")
    keys = set(RemediationSettings._fields)
    v.known(section, keys, "remediation")
    env = v.mapping(section, "daemon_env") if "daemon_env" in section else {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or \
                not isinstance(value, (str, int, float)) or isinstance(value, bool):
            v.fail(f"remediation.daemon_env.{name}", "must map a variable name to a string")
    return RemediationSettings(
        quit_timeout_s=v.number(section, "quit_timeout_s", 10.0, "remediation", 0.0, 600.0),
        term_timeout_s=v.number(section, "term_timeout_s", 5.0, "remediation", 0.1, 600.0),
        verify_timeout_s=v.number(section, "verify_timeout_s", 15.0, "remediation", 0.5, 600.0),
        lock_wait_s=v.number(section, "lock_wait_s", 30.0, "remediation", 0.0, 3600.0),
        audit_log=v.abspath(section, "audit_log", DEFAULT_AUDIT_LOG, "remediation"),
        syslog=v.boolean(section, "syslog", True, "remediation"),
        daemon_env=tuple((str(k), str(val)) for k, val in sorted(env.items())),
        orphan_min_age_s=v.number(section, "orphan_min_age_s", 120.0, "remediation", 0.0),
    )


def healthcheck(config: Config) -> HealthcheckSettings:
    section = config.section("healthcheck")
    v = _Validator(config.path or "<defaults>")
    v.known(section, set(HealthcheckSettings._fields), "healthcheck")
    tag = str(v.string(section, "tag", "MPS-HC:", "healthcheck"))
    if any(c.isspace() for c in tag):
        v.fail("healthcheck.tag", f"must be one word: it is the reason's first word (got {tag!r})")
    if tag.upper().startswith("NHC"):
        v.fail("healthcheck.tag", "must not start with NHC: LBNL NHC would resume our drains")
    drain_on = str(v.string(section, "drain_on", "critical", "healthcheck"))
    if drain_on not in ("critical", "warning"):
        v.fail("healthcheck.drain_on", f"must be critical or warning (got {drain_on!r})")
    timeout = v.number(section, "timeout_s", 45.0, "healthcheck", 2.0, 3600.0)
    scontrol = v.number(section, "scontrol_timeout_s", 5.0, "healthcheck", 0.5, 60.0)
    if timeout < 2 * scontrol + 2:
        v.fail("healthcheck.timeout_s", f"must leave room for the checks and two scontrol calls: "
               f"at least 2 x scontrol_timeout_s + 2 = {2 * scontrol + 2:g} (got {timeout:g})")
    return HealthcheckSettings(
        tag=tag,
        fail_runs=_count(v, section, "fail_runs", 2),
        pass_runs=_count(v, section, "pass_runs", 2),
        timeout_s=timeout,
        scontrol_timeout_s=scontrol,
        drain_on=drain_on,
        detached=v.boolean(section, "detached", False, "healthcheck"),
        result_ttl_s=v.number(section, "result_ttl_s", 900.0, "healthcheck", 1.0),
        recheck_s=v.number(section, "recheck_s", 600.0, "healthcheck", 0.0),
    )


def _count(v: _Validator, section: Mapping[str, object], key: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        v.fail(f"healthcheck.{key}", f"must be a whole number from 1 to 100 (got {value!r})")
        return default
    return value


__all__ = ["ConfigError", "HealthcheckSettings", "RemediationSettings", "healthcheck",
           "remediation"]
