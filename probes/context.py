"""What every probe is handed: the config, the system root and the run's deadline.

``root`` is node_exporter's ``--path.rootfs``: every absolute path a probe reads is
taken under it, so a whole fixture tree can stand in for a node.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Protocol

from mps_health.config.load import Config

if TYPE_CHECKING:  # types only: a run imports what it shares when it shares it
    from mps_health.model.slurm_facts import JobList, SlurmFacts
    from mps_health.probes.queries import Queries


class NodeRead(Protocol):
    """The run's one ``scontrol show node`` (``probes.slurm.SharedRead``)."""

    def get(self, ctx: Context, wait_s: float) -> Optional[SlurmFacts]: ...


class Context(NamedTuple):
    config: Config
    root: str = "/"
    deadline: float = float("inf")  # time.monotonic() by which every fact must be in
    env: Optional[Mapping[str, str]] = None  # environment for commands (default: ours)
    # Per-job layout: Slurm's jobs here, asked once per run.
    jobs: Optional[JobList] = None
    # The run's control queries, shared by every probe: a daemon that did not answer one
    # is asked nothing more and costs one timeout. None elsewhere.
    queries: Optional[Queries] = None
    # Where the slurm source and the canary's idle gate both need the node: one
    # slurmctld call serves both.
    slurm_node: Optional[NodeRead] = None

    def path(self, absolute: str) -> str:
        """``absolute`` as seen under the configured root."""
        if self.root in ("", "/"):
            return absolute
        return os.path.join(self.root, absolute.lstrip("/"))

    @property
    def read_only(self) -> bool:
        """A run under --root looks at a tree and writes nothing anywhere: no state (the
        host's memory is not the tree's), no locks, no caches, nothing created."""
        return self.root not in ("", "/")

    def remaining(self) -> float:
        # A timeout every blocking call takes: threading's waits refuse an infinite one
        # (OverflowError), which the default deadline would give.
        return min(max(0.0, self.deadline - time.monotonic()), threading.TIMEOUT_MAX)

    @property
    def proc(self) -> str:
        return self.path("/proc")


def joined(thread: threading.Thread, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``thread`` (not at all when it is not positive; an
    unbounded deadline, inf, waits as long as threading allows); True once it ended."""
    thread.join(min(max(0.0, timeout_s), threading.TIMEOUT_MAX))
    return not thread.is_alive()


def node_name(config: Config, environ: Optional[Mapping[str, str]] = None) -> str:
    """SLURMD_NODENAME (set by slurmd), else the config's node_name, else the short hostname."""
    environ = os.environ if environ is None else environ
    name = environ.get("SLURMD_NODENAME") or config.node_name
    return name or os.uname().nodename.split(".")[0]
