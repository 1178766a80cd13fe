"""The Slurm jobs running on this node, and what each asked for: one ``squeue`` a run,
to judge MPS clients against their job's ``--gres=mps:N`` or ``gpu``. Not asked while no
daemon has a server (two small /proc reads each).
"""

from typing import NamedTuple, Optional, Tuple

from mps_health.model.facts import Instance
from mps_health.model.slurm_facts import SlurmJob
from mps_health.probes.context import Context, node_name
from mps_health.probes.slurm import node_jobs


class JobsFacts(NamedTuple):
    node_name: str
    jobs: Optional[Tuple[SlurmJob, ...]]  # None when squeue gave no usable answer
    error: str = ""
    asked: bool = True  # False: no MPS server ran, so there was no client to judge


def gres_count(job: SlurmJob, name: str) -> Optional[int]:
    """How much of GRES ``name`` the job asked per node (``gres:mps:50``, 23.x
    ``gres/mps:50``, typed ``gres:mps:a100:50``); None when it asked for none."""
    for part in job.gres.split(","):
        fields = part.removeprefix("gres:").removeprefix("gres/").split(":")
        if fields[0] == name:
            count = fields[-1].split("(")[0] if len(fields) > 1 else "1"
            return int(count) if count.isdigit() else 1
    return None


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> JobsFacts:
    from mps_health.probes.servers import read_daemon

    node = node_name(ctx.config, ctx.env)
    # The fast path: no live daemon with a server child, so no client is listed to judge.
    if not any(pid is not None and busy
               for pid, _start, busy in (read_daemon(ctx, inst) for inst in instances)):
        return JobsFacts(node, None, "", asked=False)
    found = node_jobs(ctx)
    return JobsFacts(node, found.jobs, found.error)


VALUE_TYPE = JobsFacts
