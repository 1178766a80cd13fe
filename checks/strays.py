"""strays: MPS processes that belong to no configured instance (node-wide findings).

A server whose daemon is gone holds GPU memory and takes no new clients; a daemon on a
pipe dir the config does not know was started by hand or an out-of-date script. What is
a daemon or server is the configured binary (``hostio.process_identity``), not a name:
a process named like one is at most the WARNING ``mps-impostor``.

The server binary is world-executable: a user can run it too, held under ptrace or an
LD_PRELOAD constructor, in a pipe dir of their choice. So a daemon-less server is
CRITICAL only when it was a real daemon's server (``servertrack.remembered``), genuine
and neither traced nor stopped; any other is a WARNING, one line per uid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator, List, Set, Tuple

from mps_health.checks.common import group, some
from mps_health.config.load import Config
from mps_health.hostio.process_identity import is_daemon, is_impostor, is_server, proves_nothing
from mps_health.model import registry
from mps_health.model.facts import Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, WARNING, Result, ok
from mps_health.model.servertrack import remembered
from mps_health.probes.instances import pipe_paths

if TYPE_CHECKING:
    from mps_health.model.facts_deep import ServersFacts

NAME = "strays"
CODES = ("daemon-unexpected", "server-orphaned", "server-unclaimed", "mps-impostor")

registry.check(NAME, f"{__name__}:check", ("processes", "servers"), order=20,
               summary="no MPS server or daemon outside the configured instances")

SHOWN_PIDS = 5
SHOWN_DIRS = 3


def _orphaned_servers(procs: Tuple[ProcessFact, ...], known: Set[Tuple[int, int]]
                      ) -> Iterator[Result]:
    live_controls = {p.pid: p for p in procs if is_daemon(p)}
    # Sets, not a scan of every control per server: many processes stay linear.
    control_dirs = {c.pipe_dir for c in live_controls.values() if c.pipe_dir is not None}
    unclaimed: List[ProcessFact] = []
    for p in procs:
        if not is_server(p) or p.ppid in live_controls or p.pipe_dir in control_dirs:
            continue
        if p.genuine is not True or proves_nothing(p) or (p.pid, p.start_ticks) not in known:
            # No daemon was seen with it, it is held (even a daemon's server held since),
            # or its binary could not be read: anyone may have started it.
            unclaimed.append(p)
            continue
        yield Result(NAME, CRITICAL, "server-orphaned", "",
                     f"nvidia-cuda-mps-server {p.pid} (uid {p.uid}), a server of a control "
                     f"daemon seen by an earlier run, runs with no control daemon"
                     f"{' for ' + p.pipe_dir if p.pipe_dir else ''}",
                     "run 'mps-health remediate reset' for its instance")
    yield from _unclaimed(unclaimed)


def _owners(found: Iterable[ProcessFact]) -> Iterator[Tuple[int, List[ProcessFact], str, str]]:
    """Per owner: its uid, processes, their pids ("1, 2 and 3 more") and pipe dirs."""
    for uid, mine in sorted(group(found, lambda p: p.uid).items()):
        dirs = sorted({p.pipe_dir for p in mine if p.pipe_dir is not None})
        yield (uid, mine, some([str(p.pid) for p in mine], SHOWN_PIDS),
               f" on {', '.join(dirs[:SHOWN_DIRS])}" if dirs else "")


def _unclaimed(found: List[ProcessFact]) -> Iterator[Result]:
    """Servers no daemon vouches for: one line per owner, never CRITICAL, never a reset
    (a user may start thousands, and what they run is theirs to end)."""
    for uid, mine, pids, on in _owners(found):
        held = sum(1 for p in mine if proves_nothing(p))
        how = f"; {held} of them traced or stopped" if held else ""
        unread = " (their binary could not be checked: not run as root, or a --root " \
            "tree)" if any(p.genuine is None for p in mine) else ""
        yield Result(NAME, WARNING, "server-unclaimed", "",
                     f"{len(mine)} nvidia-cuda-mps-server process(es) of uid {uid} run with "
                     f"no control daemon that vouches for them (pids {pids}{how}){on}"
                     f"{unread}: not counted as MPS's servers",
                     f"look at what they are ('ls -l /proc/{mine[0].pid}/exe', 'ps -o "
                     f"pid,user,lstart,stat,args -p {mine[0].pid}'); a user may run the "
                     "server binary; ask its owner, do not reset MPS for it")


def _impostors(procs: Tuple[ProcessFact, ...]) -> Iterator[Result]:
    """Processes named like a daemon or server that run another binary: one line per
    owner, never counted as MPS, never ended by us."""
    for uid, found, pids, on in _owners(filter(is_impostor, procs)):
        yield Result(NAME, WARNING, "mps-impostor", "",
                     f"{len(found)} process(es) of uid {uid} named like an MPS daemon or "
                     f"server run another binary than the configured one (pids {pids})"
                     f"{on}: not counted as MPS",
                     f"see what they are ('ls -l /proc/{found[0].pid}/exe', 'ps -o "
                     f"pid,user,lstart,args -p {found[0].pid}'); after an update of the MPS "
                     "binaries, restart MPS; otherwise ask their owner")


def _unexpected(procs: Tuple[ProcessFact, ...], insts: Tuple[Instance, ...], root: str,
                layout: str) -> Iterator[Result]:
    known = {path for i in insts for path in pipe_paths(i, root)}
    for p in procs if layout != "per-job" else ():
        if is_daemon(p) and p.pipe_dir is not None and p.pipe_dir not in known:
            yield Result(NAME, WARNING, "daemon-unexpected", "",
                         f"control daemon {p.pid} (uid {p.uid}) serves {p.pipe_dir}, which no "
                         "configured instance uses", "stop it, or add it to the config's mps "
                         "section")


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    servers: ServersFacts = facts.get("servers")
    found = list(_orphaned_servers(procs, remembered(servers.previous)))
    found += _impostors(procs)
    found += _unexpected(procs, facts.instances, facts.root, config.mps.layout)
    yield from found
    if not found:
        yield ok(NAME, "", "no MPS process outside the configured instances")
