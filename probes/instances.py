"""Which MPS instances this node should have, from the config's layout.

node: one daemon. per-gpu: one per listed GPU. per-job: one per pipe dir a prolog made,
found by the template. Per-job dirs live where every user can write (/tmp), so a name
proves nothing: a dir is an instance only when ``squeue`` says its job runs here and it
is owned as ``mps.dir_owner`` says; the orphans check names the rest.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from mps_health.config.load import Config
from mps_health.model.facts import DirFact, Instance
from mps_health.probes.context import Context


def configured(config: Config) -> Tuple[Instance, ...]:
    """Instances known from the config alone (none for per-job)."""
    mps = config.mps
    if mps.layout == "node":
        return (Instance("node", "node", mps.pipe_dir, mps.log_dir),)
    if mps.layout == "per-gpu":
        from mps_health.config.templates import expand  # the node layout has no template

        return tuple(Instance(f"gpu{g}", "per-gpu", expand(mps.pipe_dir, gpu=g),
                              expand(mps.log_dir, gpu=g), gpu=g) for g in mps.gpus)
    return ()


def matching(ctx: Context, template: str) -> List[Tuple[str, Tuple[str, str]]]:
    """(path, (job, gpu)) of each entry in ``template``'s parent dir that fits it, by name."""
    from mps_health.config.templates import match

    parent = os.path.dirname(template)
    try:
        names = sorted(os.listdir(ctx.path(parent)))
    except OSError:
        return []
    return [(os.path.join(parent, name), fields) for name in names
            if (fields := match(template, name)) is not None]


def discover_jobs(ctx: Context) -> Tuple[Instance, ...]:
    """Every entry in the pipe dir's parent that fits the template (owner unchecked)."""
    from mps_health.config.templates import expand

    mps = ctx.config.mps
    return tuple(Instance(f"job{job}" + (f"-gpu{gpu}" if gpu else ""), "per-job", path,
                          expand(mps.log_dir, job, gpu), gpu=gpu or None, job_id=job)
                 for path, (job, gpu) in matching(ctx, mps.pipe_dir))


class SlurmUnavailable(RuntimeError):
    """The per-job layout's instances cannot be known without Slurm's job list."""


def _owner_uid(ctx: Context, path: str) -> Optional[int]:
    try:
        return os.lstat(ctx.path(path)).st_uid
    except OSError:
        return None


def running_jobs(ctx: Context, found: Tuple[Instance, ...]) -> Tuple[Instance, ...]:
    """The dirs of ``found`` whose job Slurm runs here (``ctx.jobs``), owned as
    ``mps.dir_owner`` says."""
    if ctx.jobs is None or ctx.jobs.jobs is None:
        why = ctx.jobs.error if ctx.jobs is not None else "not asked"
        raise SlurmUnavailable(f"per-job instances need Slurm's job list: {why}")
    uid_of = {j.job_id: j.uid for j in ctx.jobs.jobs}
    owner = ctx.config.mps.dir_owner
    fixed = daemon_uid(owner, None)  # a named user's uid; None for "job" and "any"
    return tuple(i for i in found if i.job_id in uid_of
                 and (owner == "any" or _owner_uid(ctx, i.pipe_dir)
                      == (uid_of[i.job_id] if owner == "job" else fixed)))


def gather(ctx: Context) -> Tuple[Instance, ...]:
    if ctx.config.mps.layout == "per-job":
        return running_jobs(ctx, discover_jobs(ctx))
    return configured(ctx.config)


def pipe_paths(inst: Instance, root: str) -> Tuple[str, ...]:
    """The pipe dir as a daemon's environ may name it (with and without --root)."""
    if root in ("", "/"):
        return (inst.pipe_dir,)
    return (inst.pipe_dir, os.path.join(root, inst.pipe_dir.lstrip("/")))


def expected_uid(user: str, pipe: Optional[DirFact]) -> Optional[int]:
    """The uid the daemon should run as: a name, a number, "job" (pipe dir owner), "any"."""
    return daemon_uid(user, pipe.uid if pipe is not None and pipe.kind == "dir" else None)


def daemon_uid(user: str, dir_uid: Optional[int]) -> Optional[int]:
    """``expected_uid`` from the owner of the instance's dir (None: unknown)."""
    if user in ("any", "job"):
        return dir_uid if user == "job" else None
    from mps_health.hostio.users import uid_of  # the passwd lookup only for a name

    return uid_of(user)

