"""Entry point of the installed Prolog, TaskProlog and Epilog scripts.

``main("prolog" | "task-prolog" | "epilog", config_path)``. slurmd runs these for every
job, so a job holding no GPU costs one environment lookup (no config, YAML or syslog
loaded). Every failure is one logged line, never a traceback; non-zero drains the node, so
only the prolog's start-failure policy and an unkillable process in the epilog return 1.
By hand: ``python3 -m mps_health.slurm.hooks prolog --config FILE`` with SLURM_* set.
"""

from __future__ import annotations

import os
import sys
from typing import List, Mapping, Optional

HOOKS = ("prolog", "task-prolog", "epilog")
# Kept here, not imported, so that a job without GPUs imports nothing else.
GPU_VARS = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")


def _holds_gpus(env: Mapping[str, str]) -> bool:
    return any(env.get(name, "").strip() not in ("", "NoDevFiles") for name in GPU_VARS)


def main(hook: str, config_path: Optional[str] = None,
         env: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if env is None else env
    if hook not in HOOKS:
        print(f"mps-health: unknown hook {hook!r} (one of {', '.join(HOOKS)})", file=sys.stderr)
        return 0 if hook == "epilog" else 1
    if not _holds_gpus(env):
        return 0  # the fast path: most jobs on most nodes
    from mps_health.slurm.hooklog import HookLog

    log = HookLog(hook, env.get("SLURM_JOB_ID", "?"))
    try:
        return _run(hook, config_path, env, log)
    except Exception as e:  # the edge: one line, and the hook's safe exit code
        if os.environ.get("MPS_HEALTH_DEBUG"):
            raise
        text = (str(e).strip().splitlines() or [""])[0]
        log.error(f"internal error: {type(e).__name__}: {text} (set MPS_HEALTH_DEBUG=1 "
                  "for a traceback, and report it)")
        return 1 if hook == "prolog" else 0


def _run(hook: str, config_path: Optional[str], env: Mapping[str, str], log) -> int:
    from mps_health.config.jobs import jobs_settings
    from mps_health.config.load import ConfigError, load
    from mps_health.engine import registry  # the check table the checks section names
    from mps_health.slurm.jobenv import JobEnvError, parse_job_env, wants_daemon

    try:
        config = load(config_path, table=registry)
        settings = jobs_settings(config)
    except ConfigError as e:
        log.error(f"{e}; fix the config (nothing was done for this job)")
        # A prolog with a broken config cannot give MPS jobs their daemon: say so to Slurm.
        mps_job = bool(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
        return 1 if hook == "prolog" and mps_job else 0
    if settings.log_file:
        log.log_file = settings.log_file
    if hook == "task-prolog":
        from mps_health.slurm.lifecycle import task_prolog

        log.to_stderr = False  # the task's stderr is the user's
        return task_prolog(env, config, sys.stdout, log)
    try:
        job = parse_job_env(env)
    except JobEnvError as e:
        log.error(str(e))
        return 0
    if hook == "prolog":
        if not wants_daemon(job, settings.start_for):
            return 0  # a whole-GPU job under start_for: mps (the rest is not imported)
        from mps_health.slurm.lifecycle import prolog

        return prolog(job, config, settings, log)
    from mps_health.slurm.lifecycle import epilog

    return epilog(job, config, settings, log)


def cli(argv: Optional[List[str]] = None) -> int:
    """``python3 -m mps_health.slurm.hooks HOOK [--config FILE]``."""
    args = sys.argv[1:] if argv is None else argv
    config = None
    if len(args) == 3 and args[1] == "--config":
        config = args[2]
    elif len(args) != 1:
        print(f"usage: python3 -m mps_health.slurm.hooks {{{','.join(HOOKS)}}} "
              "[--config FILE]", file=sys.stderr)
        return 3
    return main(args[0], config)


if __name__ == "__main__":
    sys.exit(cli())
