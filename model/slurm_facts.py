"""What Slurm says of this node and its jobs, as records: importable without the Slurm
probe (``probes.slurm``), which a run loads only when a check needs Slurm.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple


class GresItem(NamedTuple):
    """One GRES of a node's Gres/GresUsed, e.g. ``mps:(null):1(IDX:0)``."""

    name: str
    type: Optional[str]
    quantity: int
    indices: Optional[Tuple[int, ...]] = None  # GPU indices in use (IDX, or used a/b slots)
    per_device: Optional[Tuple[Tuple[int, int], ...]] = None  # 23.11+: (used, total) per GPU


class SlurmNode(NamedTuple):
    name: str
    state: str  # as Slurm prints it: "IDLE", "MIXED+DRAIN", ...
    flags: Tuple[str, ...]  # the state split on '+': ("MIXED", "DRAIN"); '*' NOT_RESPONDING
    reason: str  # without Slurm's trailing "[user@time]"; "" when none
    gres: Tuple[GresItem, ...]
    gres_used: Optional[Tuple[GresItem, ...]]  # None when Slurm did not print it
    slurmd_version: Optional[str] = None
    partitions: Tuple[str, ...] = ()  # the partitions the node is in

    def reason_is(self, tag: str) -> bool:
        """Is the reason tagged ``tag``? Its first word is the tag (NHC's rule), so a
        human's reason that only begins with the same letters is never taken for ours."""
        words = self.reason.split(None, 1)
        return bool(words) and words[0] == tag


class SlurmJob(NamedTuple):
    job_id: str
    user: str
    uid: int
    state: str
    elapsed_s: Optional[float]
    gres: str  # squeue's tres-per-node, e.g. "gres:mps:50" (probes.jobs.gres_count reads it)


class SlurmFacts(NamedTuple):
    node_name: str
    node: Optional[SlurmNode] = None
    error_code: Optional[str] = None  # timeout | unreachable | node-unknown | exec-failed | ...
    error: Optional[str] = None  # one line for the admin
    jobs: Optional[Tuple[SlurmJob, ...]] = None  # None: not asked, or it failed (jobs_error)
    jobs_error: Optional[str] = None
    calls: Tuple[str, ...] = ()  # every command this run started, for the record


class JobList(NamedTuple):
    """Slurm's jobs on this node, asked once per run for the per-job layout's instances."""

    jobs: Optional[Tuple[SlurmJob, ...]]  # None when squeue failed
    error: str = ""
