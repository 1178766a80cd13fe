"""strays: MPS processes that belong to no configured instance.

An ``nvidia-cuda-mps-server`` whose control daemon is gone holds GPU memory and takes
no new clients; a control daemon on a pipe dir the config does not know was started by
hand or by an out-of-date script. Both are node-wide findings (instance "").
"""

from __future__ import annotations

from mps_health.config import Config
from mps_health.facts import Facts, Instance, ProcessFact
from mps_health.instances import pipe_paths
from mps_health.results import CRITICAL, WARNING, Result, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, Tuple

NAME = "strays"
# Every code this check reports besides ok (each has a runbook entry in README.md).
CODES = ("daemon-unexpected", "server-orphaned")


def _orphaned_servers(procs: Tuple[ProcessFact, ...]) -> Iterator[Result]:
    live_controls = {p.pid: p for p in procs if p.role == "control" and p.state not in "ZX"}
    # Sets, not a scan of every control per server: many processes stay linear.
    control_dirs = {c.pipe_dir for c in live_controls.values() if c.pipe_dir is not None}
    for p in procs:
        if p.role != "server" or p.state in ("Z", "X"):
            continue
        parent_alive = p.ppid in live_controls
        same_dir = p.pipe_dir in control_dirs
        if not parent_alive and not same_dir:
            yield Result(NAME, CRITICAL, "server-orphaned", "",
                         f"nvidia-cuda-mps-server {p.pid} (uid {p.uid}) runs with no control "
                         f"daemon{' for ' + p.pipe_dir if p.pipe_dir else ''}",
                         "run 'mps-health remediate reset' for its instance")


def _unexpected(procs: Tuple[ProcessFact, ...], insts: Tuple[Instance, ...], root: str,
                layout: str) -> Iterator[Result]:
    known = {path for i in insts for path in pipe_paths(i, root)}
    for p in procs:
        if p.role == "control" and p.state not in ("Z", "X") and p.pipe_dir is not None \
                and p.pipe_dir not in known and layout != "per-job":
            yield Result(NAME, WARNING, "daemon-unexpected", "",
                         f"control daemon {p.pid} (uid {p.uid}) serves {p.pipe_dir}, which no "
                         "configured instance uses", "stop it, or add it to the config's mps "
                         "section")


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    found = list(_orphaned_servers(procs))
    found += _unexpected(procs, facts.instances, facts.root, config.mps.layout)
    yield from found
    if not found:
        yield ok(NAME, "", "no MPS process outside the configured instances")
