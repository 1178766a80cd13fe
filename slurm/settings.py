"""The ``jobs`` config section (per-job MPS life cycle), checked key by key.

The Prolog, TaskProlog and Epilog read the same file as the checks: ``mps`` gives the
layout and the pipe/log dir templates, ``commands`` the control binary, and ``jobs``
how the hooks behave. Errors use the core's one-line style
("FILE: key 'jobs.start_timeout_s': what is wrong").
"""

import os
from typing import Any, Mapping, NamedTuple, Optional

from mps_health.config import Config, ConfigError

START_FOR = ("mps", "gpu")
ON_FAILURE = ("fail", "continue")
SUN_PATH_MAX = 108  # sockaddr_un.sun_path, NUL included
LONGEST_ENTRY = "control_privileged"  # the longest name the daemon binds in the pipe dir
# The longest values a template field takes: Slurm job ids are 32-bit; Slurm gives GPU
# indices (a UUID in CUDA_VISIBLE_DEVICES is caught when the prolog makes the path).
LONGEST_FIELDS = {"job": "4294967295", "gpu": "99"}


class JobsSettings(NamedTuple):
    # Which jobs get a daemon: "mps" only jobs with a gres/mps share (Slurm then sets
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the prolog); "gpu" every job holding GPUs.
    start_for: str = "mps"
    start_timeout_s: float = 10.0  # the daemon must answer within this
    quit_timeout_s: float = 5.0  # the epilog's `quit -t N`: servers are forced after N s
    kill_grace_s: float = 3.0  # after SIGTERM, before SIGKILL, of verified leftovers
    # "fail": the prolog exits 1 when it cannot give an MPS job its daemon (Slurm drains
    # the node and requeues the job); "continue": log it, the job runs without MPS.
    on_start_failure: str = "fail"
    log_file: Optional[str] = None  # also append hook log lines here (syslog always)


def _where(config: Config) -> str:
    return config.path or "<defaults>"


def _fail(config: Config, key: str, why: str) -> ConfigError:
    return ConfigError(f"{_where(config)}: key '{key}': {why}")


def _number(config: Config, d: Mapping[str, Any], key: str, default: float, low: float,
            high: float) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:
        raise _fail(config, f"jobs.{key}", f"must be a number between {low:g} and {high:g} "
                    f"(got {value!r})")
    return float(value)


def _choice(config: Config, d: Mapping[str, Any], key: str, choices: tuple) -> str:
    value = d.get(key, choices[0])
    if value not in choices:
        raise _fail(config, f"jobs.{key}", f"must be one of {', '.join(choices)} "
                    f"(got {value!r})")
    return str(value)


def jobs_settings(config: Config) -> JobsSettings:
    """The ``jobs`` section, validated; also checks the per-job dir templates fit."""
    d = config.section("jobs")
    for key in d:
        if key not in JobsSettings._fields:
            raise _fail(config, f"jobs.{key}",
                        f"unknown key (known here: {', '.join(sorted(JobsSettings._fields))})")
    log_file = d.get("log_file")
    if log_file is not None and (not isinstance(log_file, str) or not log_file.startswith("/")):
        raise _fail(config, "jobs.log_file", f"must be an absolute path (got {log_file!r})")
    if config.mps.layout == "per-job":
        check_templates(config)
    return JobsSettings(
        start_for=_choice(config, d, "start_for", START_FOR),
        start_timeout_s=_number(config, d, "start_timeout_s", 10.0, 0.5, 120.0),
        quit_timeout_s=_number(config, d, "quit_timeout_s", 5.0, 0.0, 120.0),
        kill_grace_s=_number(config, d, "kill_grace_s", 3.0, 0.1, 60.0),
        on_start_failure=_choice(config, d, "on_start_failure", ON_FAILURE),
        log_file=log_file,
    )


def socket_path_bytes(pipe_dir: str) -> int:
    """Bytes of the longest socket path the daemon binds in ``pipe_dir``, NUL included."""
    return len(pipe_dir.encode()) + 1 + len(LONGEST_ENTRY) + 1


def check_templates(config: Config) -> None:
    """Per-job templates the hooks can use: {job} and {gpu} only, in the last component."""
    mps = config.mps
    for key, template in (("mps.pipe_dir", mps.pipe_dir), ("mps.log_dir", mps.log_dir)):
        parent, name = os.path.split(template)
        if "{" in parent or "}" in parent:
            raise _fail(config, key, "{job} and {gpu} may only appear in the last path "
                        "component (the parent dir is shared by every job)")
        try:
            name.format(job="1", gpu="0")
        except (KeyError, IndexError, ValueError):
            raise _fail(config, key, "only the fields {job} and {gpu} are allowed") from None
        if any(c.isspace() for c in template):
            raise _fail(config, key, "must not contain white space (TaskProlog exports it)")
    if "{gpu}" in mps.pipe_dir and "{gpu}" not in mps.log_dir:
        raise _fail(config, "mps.log_dir", "needs {gpu} too when mps.pipe_dir has it (one "
                    "daemon per GPU, each with its own control.log)")
    longest = socket_path_bytes(mps.pipe_dir.format(**LONGEST_FIELDS))
    if longest > SUN_PATH_MAX:
        raise _fail(config, "mps.pipe_dir", f"too long for a unix socket path ({longest} bytes "
                    f"with the largest job id and '/{LONGEST_ENTRY}', limit {SUN_PATH_MAX})")
