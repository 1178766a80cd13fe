"""orphans: per-job MPS dirs and daemons whose job no longer runs on this node.

A failed epilog or a reboot mid-job leaves the per-job Prolog's dirs and daemon behind.
Jobs alive here: the run's one squeue (any state: COMPLETING is no orphan); a dir
younger than ``orphans.min_age_s`` is not judged. A leftover server a daemon vouched for
still holds the GPU: CRITICAL; anything else left: WARNING.

A dir is ours only when the Prolog recorded it for that job (``hostio.jobrecords``) and
it belongs to the recorded uid or root: anyone can make a back-dated dir named like an
ended job's in /tmp with a fake server in it. Such a dir is never judged nor removed;
old enough, it is one WARNING per owner (``orphan-unrecorded``) for an admin to see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, Set, Tuple

from mps_health.checks.common import PING, group, slurm_unavailable, some
from mps_health.config.load import Config
from mps_health.config.slurm import orphan_settings
from mps_health.engine import registry
from mps_health.engine.actionhints import advice
from mps_health.model.facts import Facts, ProcessFact
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, Result
from mps_health.probes.process_identity import is_daemon, is_server, proves_nothing
from mps_health.probes.servertrack import remembered

if TYPE_CHECKING:  # fact types only: few runs run the check
    from mps_health.model.slurm_facts import SlurmFacts
    from mps_health.probes.jobdirs import JobDir, JobRecords

NAME = "orphans"
CODES = ("orphan-daemon", "orphan-dir", "orphan-server", "orphan-unrecorded",
         "job-records-unreadable", "slurm-unavailable")

registry.check(NAME, f"{__name__}:check",
               ("slurm", "job_dirs", "job_records", "processes", "servers"),
               default_on=False, when_configured=("slurm", "orphans"), order=120,
               summary="no per-job MPS dirs or daemons outlive their job")

SHOWN = 3  # paths named per owner of unrecorded dirs (the rest counted)
# An ended job is no instance any more ('remediate reset jobN' would name none): this
# removes every recorded leftover of ended jobs, as the check selects them.
ORPHANS = ("mps-health", "remediate", "orphans")
REMOVE = advice("run ", (*ORPHANS, "--dry-run"), " to see what it would stop and remove, "
                "then ", ORPHANS)


def age_text(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def _processes_for(paths: List[str], procs: Tuple[ProcessFact, ...], role: str
                   ) -> List[ProcessFact]:
    which = is_server if role == "server" else is_daemon
    return [p for p in procs if which(p) and p.pipe_dir is not None and p.pipe_dir in paths]


def check(facts: Facts, config: Config) -> Iterator[Result]:
    if config.mps.layout != "per-job":
        yield Result(NAME, OK, "ok", "", f"layout '{config.mps.layout}' has no per-job dirs")
        return
    min_age = orphan_settings(config).min_age_s
    slurm: SlurmFacts = facts.sources["slurm"]  # type: ignore[assignment]
    dirs: Tuple[JobDir, ...] = facts.sources["job_dirs"]  # type: ignore[assignment]
    procs: Tuple[ProcessFact, ...] = facts.sources["processes"]  # type: ignore[assignment]
    if slurm.jobs is None:
        yield slurm_unavailable(NAME, slurm) if slurm.node is None else Result(
            NAME, UNKNOWN, "slurm-unavailable", "",
            f"cannot tell which jobs run here: {slurm.jobs_error}", PING)
        return
    alive = {j.job_id for j in slurm.jobs}
    daemons = {p.pid for p in procs if is_daemon(p)}
    known = remembered(facts.sources["servers"].previous)  # type: ignore[attr-defined]
    records: JobRecords = facts.sources["job_records"]  # type: ignore[assignment]
    if records.error:
        yield _unreadable(records)
    by_job, strangers = split_ours(dirs, records, alive)
    found = 0
    for job_id, jds in sorted(by_job.items(), key=lambda kv: int(kv[0])):
        if job_id in alive:
            continue
        age = facts.taken_at - max(d.mtime for d in jds)
        if age < min_age:
            continue
        found += 1
        owner = next((d.owner or str(d.uid) for d in jds if d.role == "pipe"),
                     jds[0].owner or str(jds[0].uid))
        paths = [d.path for d in jds if d.role == "pipe"]
        servers = _processes_for(paths, procs, "server")
        controls = _processes_for(paths, procs, "control")
        where = ", ".join(f"{d.role} dir {d.path}" for d in jds)
        head = f"job {job_id} (owner {owner}) no longer runs here but left {where}, " \
               f"{age_text(age)} old"
        action, values = REMOVE, (("age_s", float(age)),)
        # A genuine binary alone proves nothing (anyone may run it, held): CRITICAL only for
        # a server a daemon was seen with (its child, or in the servers' memory).
        held = [p for p in servers if p.genuine and not proves_nothing(p)
                and (p.ppid in daemons or (p.pid, p.start_ticks) in known)]
        state, code, tail = (
            (CRITICAL, "orphan-server", f"; its MPS server {held[0].pid} still holds the GPU")
            if held else  # else no daemon vouches for it, or its binary could not be read
            (WARNING, "orphan-server", f"; a process named like its MPS server "
             f"({servers[0].pid}) still runs (no daemon was seen with it, it is held, or its "
             "binary could not be checked)") if servers else
            (WARNING, "orphan-daemon", f"; its control daemon {controls[0].pid} still runs")
            if controls else (WARNING, "orphan-dir", ""))
        yield Result(NAME, state, code, f"job{job_id}", head + tail, action.text, values,
                     commands=action.commands)
    for result in unrecorded(strangers, facts.taken_at, min_age):
        found += 1
        yield result
    if not found and not records.error:
        yield Result(NAME, OK, "ok", "",
                     f"no orphaned per-job MPS dirs ({len({d.job_id for d in dirs})} job dirs, "
                     f"{len(alive)} jobs on {slurm.node_name})", "", (("orphans", 0.0),))


def split_ours(dirs: Tuple[JobDir, ...], records: JobRecords, alive: Set[str]
               ) -> Tuple[Dict[str, List[JobDir]], List[JobDir]]:
    """Ended jobs' dirs: ({job id: those of its record}, the others)."""
    from mps_health.hostio import jobrecords  # only where the check runs

    record_of = jobrecords.by_job(records.records)
    ended = group((d for d in dirs if d.job_id not in alive),
                  lambda d: jobrecords.ours(record_of.get(d.job_id), d.path, d.uid))
    return group(ended.get(True, []), lambda d: d.job_id), ended.get(False, [])


def unrecorded(strangers: List[JobDir], now: float, min_age: float) -> Iterator[Result]:
    """One WARNING per owner of the dirs ``split_ours`` does not claim (never removed)."""
    old = (d for d in strangers if now - d.mtime >= min_age)
    for uid, jds in sorted(group(old, lambda d: d.uid).items()):
        owner = jds[0].owner or str(uid)
        paths = sorted(d.path for d in jds)
        yield Result(NAME, WARNING, "orphan-unrecorded", "",
                     f"{len(paths)} entr{'y' if len(paths) == 1 else 'ies'} named like an "
                     f"ended job's MPS dir but not made for that job by our Prolog, owned by "
                     f"{owner} (uid {uid}): {some(paths, SHOWN)}; not judged, "
                     "never removed by mps-health",
                     f"ask {owner} what they are; if unwanted, remove them by hand "
                     f"('rm -rf --one-file-system -- {paths[0]}')",
                     (("unrecorded", float(len(paths))),), (("uid", str(uid)),))


def _unreadable(records: JobRecords) -> Result:
    """The Prolog's records could not be read: no leftover can be told to be ours. Denied
    is an unprivileged run (check_mps as nagios): root's runs can tell (UNKNOWN)."""
    return Result(NAME, UNKNOWN if records.denied else WARNING, "job-records-unreadable", "",
                  f"cannot tell which per-job dirs are ours: {records.error}",
                  "run the check as root (the health check does)" if records.denied else
                  "look at the file (who wrote it?), then move it aside; the next Prolog "
                  "writes it afresh, and leftovers meanwhile show as orphan-unrecorded")
