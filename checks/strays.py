"""strays: MPS processes that belong to no configured instance.

An ``nvidia-cuda-mps-server`` whose control daemon is gone holds GPU memory and takes
no new clients; a control daemon on a pipe dir the config does not know was started by
hand or by an out-of-date script. Both are node-wide findings (instance "").

What is a daemon or a server is decided by ``mps_health.core.process_identity`` (the configured
binary, not the name anyone can give a process): a user's process named like a server is
at most the WARNING ``mps-impostor``, naming its owner, never a CRITICAL. Where the binary
cannot be checked (not run as root) a server without a daemon is only a WARNING.
"""

from __future__ import annotations

from ..core.config import Config
from ..core.facts import Facts, Instance, ProcessFact
from ..core.instances import pipe_paths
from ..core.process_identity import is_daemon, is_impostor, is_server
from ..core.results import CRITICAL, WARNING, Result, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterator, List, Tuple

NAME = "strays"
# Every code this check reports besides ok (each has a runbook entry in README.md).
CODES = ("daemon-unexpected", "server-orphaned", "mps-impostor")
SHOWN_PIDS = 5
SHOWN_DIRS = 3


def _orphaned_servers(procs: Tuple[ProcessFact, ...]) -> Iterator[Result]:
    live_controls = {p.pid: p for p in procs if is_daemon(p)}
    # Sets, not a scan of every control per server: many processes stay linear.
    control_dirs = {c.pipe_dir for c in live_controls.values() if c.pipe_dir is not None}
    for p in procs:
        if not is_server(p):
            continue
        parent_alive = p.ppid in live_controls
        same_dir = p.pipe_dir in control_dirs
        if parent_alive or same_dir:
            continue
        text = (f"nvidia-cuda-mps-server {p.pid} (uid {p.uid}) runs with no control "
                f"daemon{' for ' + p.pipe_dir if p.pipe_dir else ''}")
        if p.genuine:
            yield Result(NAME, CRITICAL, "server-orphaned", "", text,
                         "run 'mps-health remediate reset' for its instance")
        else:  # its binary could not be read: it may be a process only named like one
            yield Result(NAME, WARNING, "server-orphaned", "",
                         text + " (its binary could not be checked: not run as root, or a "
                         "--root tree; it may be a process only named like a server)",
                         "run the check as root on the node to tell; if it is a server, run "
                         "'mps-health remediate reset' for its instance")


def _impostors(procs: Tuple[ProcessFact, ...]) -> Iterator[Result]:
    """Processes named like a daemon or server that run another binary: one line per
    owner (a user can start thousands), never counted as MPS, never ended by us."""
    by_uid: Dict[int, List[ProcessFact]] = {}
    for p in procs:
        if is_impostor(p):
            by_uid.setdefault(p.uid, []).append(p)
    for uid, found in sorted(by_uid.items()):
        pids = ", ".join(str(p.pid) for p in found[:SHOWN_PIDS])
        more = f" and {len(found) - SHOWN_PIDS} more" if len(found) > SHOWN_PIDS else ""
        dirs = sorted({p.pipe_dir for p in found if p.pipe_dir is not None})
        on = f" on {', '.join(dirs[:SHOWN_DIRS])}" if dirs else ""
        yield Result(NAME, WARNING, "mps-impostor", "",
                     f"{len(found)} process(es) of uid {uid} named like an MPS daemon or "
                     f"server run another binary than the configured one (pids {pids}{more})"
                     f"{on}: not counted as MPS",
                     f"see what they are ('ls -l /proc/{found[0].pid}/exe', 'ps -o "
                     f"pid,user,lstart,args -p {found[0].pid}'); after an update of the MPS "
                     "binaries, restart MPS; otherwise ask their owner")


def _unexpected(procs: Tuple[ProcessFact, ...], insts: Tuple[Instance, ...], root: str,
                layout: str) -> Iterator[Result]:
    known = {path for i in insts for path in pipe_paths(i, root)}
    for p in procs:
        if is_daemon(p) and p.pipe_dir is not None \
                and p.pipe_dir not in known and layout != "per-job":
            yield Result(NAME, WARNING, "daemon-unexpected", "",
                         f"control daemon {p.pid} (uid {p.uid}) serves {p.pipe_dir}, which no "
                         "configured instance uses", "stop it, or add it to the config's mps "
                         "section")


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    found = list(_orphaned_servers(procs))
    found += _impostors(procs)
    found += _unexpected(procs, facts.instances, facts.root, config.mps.layout)
    yield from found
    if not found:
        yield ok(NAME, "", "no MPS process outside the configured instances")
