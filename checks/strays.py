"""strays: MPS processes that belong to no configured instance (node-wide findings).

A server whose daemon is gone holds GPU memory and takes no new clients; a daemon on a
pipe dir the config does not know was started by hand or an out-of-date script. What is
a daemon or server is the configured binary (``probes.process_identity``), not a name:
a process named like one is at most the WARNING ``mps-impostor``.

The server binary is world-executable: a user can run it too, held under ptrace or an
LD_PRELOAD constructor, in a pipe dir of their choice. So a daemon-less server is
CRITICAL only when it was a real daemon's server (``servertrack.remembered``), genuine
and neither traced nor stopped; any other is a WARNING, one line per uid. In the per-job
layout, a server that outlives its job's daemon while Slurm still lists the job is that
job's WARNING (its user can kill their own daemon): CRITICAL only once the job has ended.

The same binary held on a live daemon's pipe dir, not that daemon's child, is a user's
way to hang the daemon and every client (the daemon waits on it):
``server-stopped-foreign``, one WARNING per uid, never a reset. A running foreign server
there is left to the daemon.
"""

from __future__ import annotations

import os
from typing import (
    TYPE_CHECKING,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Set,
    Tuple,
)

from mps_health.checks.common import group, reset_action, some
from mps_health.config.load import Config
from mps_health.config.templates import match
from mps_health.engine import registry
from mps_health.engine.actionhints import RESET, quoted
from mps_health.model.facts import Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, WARNING, Result, ok
from mps_health.probes.instances import pipe_paths
from mps_health.probes.process_identity import is_daemon, is_impostor, is_server, proves_nothing
from mps_health.probes.servertrack import remembered

if TYPE_CHECKING:
    from mps_health.model.facts_deep import ServersFacts

NAME = "strays"
CODES = ("daemon-unexpected", "server-orphaned", "server-unclaimed", "server-stopped-foreign",
         "mps-impostor")

registry.check(NAME, f"{__name__}:check", ("processes", "servers"), order=20,
               summary="no MPS server or daemon outside the configured instances")

SHOWN_PIDS = 5
SHOWN_DIRS = 3


class JobsHere(NamedTuple):
    """The per-job instances whose job Slurm still lists on this node."""

    by_pipe_dir: Mapping[str, str]  # pipe dir -> instance name, of the instances judged
    unjudged: FrozenSet[str]  # job ids whose MPS is being set up or torn down
    template: str  # mps.pipe_dir ("" in the other layouts)

    def instance_of(self, pipe_dir: str) -> str:
        """The instance name of the job still here that ``pipe_dir`` is of, else ""."""
        name = self.by_pipe_dir.get(pipe_dir, "")
        if name or not self.unjudged or os.path.dirname(pipe_dir) != \
                os.path.dirname(self.template):
            return name
        fields = match(self.template, os.path.basename(pipe_dir))
        if fields is None or fields[0] not in self.unjudged:
            return ""
        return f"job{fields[0]}" + (f"-gpu{fields[1]}" if fields[1] else "")


def jobs_here(facts: Facts, config: Config) -> JobsHere:
    if config.mps.layout != "per-job":
        return JobsHere({}, frozenset(), "")
    return JobsHere({path: i.name for i in facts.instances if i.layout == "per-job"
                     for path in pipe_paths(i, facts.root)},
                    frozenset(job for job, _why in facts.unjudged), config.mps.pipe_dir)


def _orphaned_servers(procs: Tuple[ProcessFact, ...], known: Set[Tuple[int, int]],
                      jobs: JobsHere) -> Iterator[Result]:
    live_controls = {p.pid: p for p in procs if is_daemon(p)}
    # Dicts and sets, not a scan of every control per server: many processes stay linear.
    daemons_on: Dict[str, Set[int]] = {}
    for c in live_controls.values():
        if c.pipe_dir is not None:
            daemons_on.setdefault(c.pipe_dir, set()).add(c.pid)
    unclaimed: List[ProcessFact] = []
    blocking: List[ProcessFact] = []
    for p in procs:
        if not is_server(p):
            continue
        if p.pipe_dir is not None and p.pipe_dir in daemons_on:
            if _blocks(p, daemons_on[p.pipe_dir]):
                blocking.append(p)
            continue
        if p.ppid in live_controls:
            continue
        if p.genuine is not True or proves_nothing(p) or (p.pid, p.start_ticks) not in known:
            # No daemon was seen with it, it is held (even a daemon's server held since),
            # or its binary could not be read: anyone may have started it.
            unclaimed.append(p)
            continue
        job = jobs.instance_of(p.pipe_dir) if p.pipe_dir is not None else ""
        yield _orphaned(p, job) if job else Result(
            NAME, CRITICAL, "server-orphaned", "",
            f"nvidia-cuda-mps-server {p.pid} (uid {p.uid}), a server of a control "
            f"daemon seen by an earlier run, runs with no control daemon"
            f"{' for ' + p.pipe_dir if p.pipe_dir else ''}",
            f"run {quoted(RESET)} for its instance", commands=(RESET,))
    yield from _unclaimed(unclaimed)
    yield from _stopped_foreign(blocking)


def _orphaned(p: ProcessFact, instance: str) -> Result:
    """A job's server that outlived its job's daemon while Slurm still lists the job: the
    job's user may have killed their own daemon, which hurts only their job. Once the job
    has ended it is the node's CRITICAL (and the orphans check's ``orphan-server``)."""
    reset = reset_action(instance)
    return Result(NAME, WARNING, "server-orphaned", instance,
                  f"nvidia-cuda-mps-server {p.pid} (uid {p.uid}), a server of this job's "
                  f"control daemon, runs with no control daemon for {p.pipe_dir}; the job "
                  "still runs: only its own MPS is affected", reset.text,
                  commands=reset.commands)


def _blocks(p: ProcessFact, daemon_pids: Set[int]) -> bool:
    """The genuine server binary, stopped or traced, on a live daemon's pipe dir and not
    that daemon's child: while it lives, the daemon and its clients may hang."""
    return p.genuine is True and proves_nothing(p) and p.ppid not in daemon_pids


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


def _stopped_foreign(found: List[ProcessFact]) -> Iterator[Result]:
    """Held servers on a live daemon's pipe dir that it did not start: one line per owner
    (a user may start thousands), never CRITICAL (a user's doing: no drain), never a
    reset (it would meet the same process)."""
    for uid, mine, pids, on in _owners(found):
        first = mine[0].pid
        unblock = ("mps-health", "remediate", "unblock")
        yield Result(NAME, WARNING, "server-stopped-foreign", "",
                     f"{len(mine)} stopped or traced nvidia-cuda-mps-server process(es) of "
                     f"uid {uid}{on}, not started by its control daemon (pids {pids}): "
                     "while one lives, the control daemon and its clients may hang",
                     f"run {quoted(unblock)} (it ends such processes), or look at it ('ps "
                     f"-o pid,user,lstart,stat,args -p {first}') and end it by hand ('kill "
                     f"-KILL {first}'); do not reset MPS for it", commands=(unblock,))


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
    found = list(_orphaned_servers(procs, remembered(servers.previous),
                                   jobs_here(facts, config)))
    found += _impostors(procs)
    found += _unexpected(procs, facts.instances, facts.root, config.mps.layout)
    yield from found
    if not found:
        yield ok(NAME, "", "no MPS process outside the configured instances")
