"""The job as slurmd describes it to the Prolog, TaskProlog and Epilog (pure, no I/O).

As Slurm 22.05 was seen to give it (tests/fixtures/slurm_hook_env__*.txt): Prolog and
Epilog run as root with no PATH, ``SLURM_JOB_ID``/``_UID``/``_GID``/``_USER``, for a GPU job
``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES`` (real indices), for a gres/mps job
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. The TaskProlog runs as the user with the task's
environment: ``SLURM_STEP_GPUS``/``SLURM_GPUS_ON_NODE``, ``CUDA_VISIBLE_DEVICES``.
"""

from typing import Mapping, NamedTuple, Optional, Tuple

from mps_health.config.templates import GPU_CHARS


class JobEnvError(ValueError):
    """The environment does not describe a job we can act on (one line)."""


class JobEnv(NamedTuple):
    job_id: str
    uid: int
    gid: int
    user: str
    gpus: Tuple[str, ...]  # CUDA_VISIBLE_DEVICES (else SLURM_JOB_GPUS), as Slurm gives them
    mps_percentage: Optional[str]  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: a gres/mps share


def parse_gpus(text: str) -> Tuple[str, ...]:
    """``0,1`` or ``GPU-uuid,...`` -> ('0', '1'); empty or Slurm's ``NoDevFiles`` -> ()."""
    text = text.strip()
    if text in ("", "NoDevFiles"):
        return ()
    gpus = tuple(g.strip() for g in text.split(","))
    if not all(g and set(g) <= GPU_CHARS for g in gpus):
        raise JobEnvError(f"CUDA_VISIBLE_DEVICES={text!r} is not a list of GPU indices or "
                          "UUIDs")
    return gpus


def _number(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    if not value.isdigit():
        raise JobEnvError(f"{name} is {'missing' if not value else repr(value)}: not run by "
                          "slurmd for a job?")
    return int(value)


def parse_job_env(env: Mapping[str, str]) -> JobEnv:
    """The job from a hook's environment; JobEnvError (one line) when it is not usable."""
    job_id = str(_number(env, "SLURM_JOB_ID"))
    uid = _number(env, "SLURM_JOB_UID")
    gid = _number(env, "SLURM_JOB_GID")
    user = env.get("SLURM_JOB_USER", "")
    if not user or "/" in user or any(c.isspace() for c in user):
        raise JobEnvError(f"SLURM_JOB_USER is {'missing' if not user else repr(user)}")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    gpus = parse_gpus(visible if visible is not None else env.get("SLURM_JOB_GPUS", ""))
    share = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if share is not None:
        try:
            if not 0 < float(share) <= 100:
                raise ValueError
        except ValueError:
            raise JobEnvError(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share!r} is not a "
                              "percentage") from None
    return JobEnv(job_id, uid, gid, user, gpus, share)


def wants_daemon(job: JobEnv, start_for: str) -> bool:
    """Does this job get an MPS daemon under the site's ``jobs.start_for``?"""
    return bool(job.gpus) and (start_for == "gpu" or job.mps_percentage is not None)
