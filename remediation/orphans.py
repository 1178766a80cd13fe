"""``remediate orphans``: stop and remove per-job MPS instances whose job has left the node.

If the one ``squeue`` call fails nothing is an orphan (a broken squeue's empty answer
must never look like "no jobs"). A pipe dir younger than ``orphans.min_age_s`` is
skipped: its job's prolog may still be setting it up. Only dirs our Prolog recorded for
the job (``hostio.jobrecords``), owned by the recorded uid or root, are orphans: a dir a
user made under a job's name is left alone (said).
"""

import os
import time
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from mps_health.config.load import Config
from mps_health.config.remediation import RemediationSettings, remediation
from mps_health.config.slurm import orphan_settings
from mps_health.hostio import jobrecords, safedirs
from mps_health.hostio.runner import SAFE_PATH, RunAs
from mps_health.hostio.users import by_uid, groups_of
from mps_health.model.exitcodes import Failure
from mps_health.model.facts import Instance
from mps_health.probes.context import Context, node_name
from mps_health.probes.instances import discover_jobs
from mps_health.probes.slurm import SlurmError, read_jobs
from mps_health.remediation import processes as procs
from mps_health.remediation.actions import (
    CANNOT,
    DONE,
    FAILED,
    Say,
    audit_for,
    lock_node,
    need_root,
)
from mps_health.remediation.daemonctl import quit_daemon
from mps_health.remediation.reset import control_path


def orphans_of(instances: Sequence[Instance], job_ids: Collection[str]) -> Tuple[Instance, ...]:
    """Per-job instances whose job Slurm does not list on this node (pure)."""
    return tuple(i for i in instances if i.job_id is not None and i.job_id not in job_ids)


def plan_lines(ctx: Context, inst: Instance, settings: RemediationSettings) -> List[str]:
    daemons, servers = procs.on_node(ctx, inst)
    lines = [f"send 'quit -t {settings.quit_timeout_s:g}' to daemon {d.pid} as its user "
             f"(uid {d.uid})" for d in daemons]
    if daemons or servers:
        listed = ", ".join(procs.describe(p) for p in (*daemons, *servers))
        lines.append(f"end what is left of {listed} by verified PID")
    lines.append(f"remove {inst.pipe_dir} and {inst.log_dir} with all they hold (made root's "
                 "0700 first; symlinks unlinked, never followed)")
    return lines


def _quit_as_owner(ctx: Context, inst: Instance, uid: int, timeout_s: float) -> str:
    user = by_uid(uid)
    # The fixed PATH reset gives a daemon: never the caller's (a user's bin first).
    env = {"PATH": SAFE_PATH,
           "CUDA_MPS_PIPE_DIRECTORY": ctx.path(inst.pipe_dir),
           "CUDA_MPS_LOG_DIRECTORY": ctx.path(inst.log_dir)}
    as_user = RunAs(user.uid, user.gid, groups_of(user)) if uid != os.geteuid() else None
    problem = quit_daemon(control_path(ctx), as_user, env, timeout_s, timeout_s + 5.0)
    return f"quit as {user.name}: {problem or 'accepted'}"


def _remove(ctx: Context, path: str, owners: Tuple[int, ...]) -> str:
    parent, name = safedirs.split(path)
    try:
        pfd = safedirs.open_dir(parent, ctx.root)
    except safedirs.UnsafePath as e:
        return f"{path}: not removed: {e}"
    try:
        kind = safedirs.look(pfd, name).kind
        if kind == "missing":
            return f"{path}: already gone"
        problems = safedirs.remove_tree(pfd, name, path, owners)
        if problems:
            raise OSError(0, "; ".join(problems))
        return f"removed {path}" + (" (a symlink: unlinked, target untouched)"
                                    if kind == "symlink" else "")
    finally:
        os.close(pfd)


def _records(ctx: Context) -> Dict[str, jobrecords.JobRecord]:
    return jobrecords.by_job(jobrecords.load(ctx.path(ctx.config.state_dir))[0])


def _owner(ctx: Context, path: str) -> int:
    try:
        return os.lstat(ctx.path(path)).st_uid
    except OSError:
        return -1


def clean_one(ctx: Context, inst: Instance, settings: RemediationSettings,
              record: Optional[jobrecords.JobRecord] = None) -> Tuple[bool, str]:
    record = record or _records(ctx).get(inst.job_id or "")
    if record is None or not jobrecords.ours(record, inst.pipe_dir,
                                             _owner(ctx, inst.pipe_dir)):
        return False, f"{inst.pipe_dir} is no longer a dir our Prolog made for the job: left"
    done = [_quit_as_owner(ctx, inst, d.uid, settings.quit_timeout_s)
            for d in procs.on_node(ctx, inst)[0] if d.state not in ("T", "t")]
    daemons, servers = procs.on_node(ctx, inst)
    ended = procs.end_all(ctx.proc, (*daemons, *servers), settings.term_timeout_s)
    done.extend(f"{e.pid}: {e.detail}" for e in ended)
    if any(e.outcome == "alive" for e in ended):
        return False, "; ".join(done) + " - dirs kept while a process lives"
    state_dir, failed = ctx.path(ctx.config.state_dir), ""
    for path in dict.fromkeys((inst.pipe_dir, inst.log_dir)):
        if path != inst.pipe_dir and not jobrecords.ours(record, path, _owner(ctx, path)):
            if _owner(ctx, path) >= 0:
                done.append(f"{path}: not made by our Prolog for the job: left alone")
            continue
        try:
            done.append(_remove(ctx, path, (record.uid, 0)))
        except OSError as e:
            failed = f"{path}: {e.strerror}"
            break
    unkept = jobrecords.drop(state_dir, record.job_id, [p for p in record.dirs
                                                        if os.path.lexists(ctx.path(p))])
    if failed:
        return False, "; ".join([*done, failed])
    return True, "; ".join([*done, unkept] if unkept else done)


def clean(ctx: Context, orphans: Sequence[Instance], settings: RemediationSettings,
          say: Say) -> int:
    """Remove ``orphans``; 0 if all went, 2 if one failed (the caller holds the lock)."""
    audit = audit_for(ctx, settings, "orphans")
    code = DONE
    records = _records(ctx)
    for inst in orphans:
        ok, text = clean_one(ctx, inst, settings, records.get(inst.job_id or ""))
        say(f"  {inst.name}: {'ok' if ok else 'FAILED'}: {text}")
        audit.record("remove", "ok" if ok else "failed", instance=inst.name,
                     job=inst.job_id or "", detail=text)
        if not ok:
            code = FAILED
    return code


def find(ctx: Context, jobs: Mapping[str, object], now: float
         ) -> Tuple[Tuple[Instance, ...], List[str]]:
    """(orphans old enough to remove, notes about the ones skipped)."""
    min_age_s = orphan_settings(ctx.config).min_age_s
    found = orphans_of(discover_jobs(ctx), set(jobs))
    old, notes = [], []
    loaded, error = jobrecords.load(ctx.path(ctx.config.state_dir))
    if error:
        notes.append(f"{error}: no dir can be told to be ours")
    records = jobrecords.by_job(loaded)
    for inst in found:
        owner = _owner(ctx, inst.pipe_dir)
        if not jobrecords.ours(records.get(inst.job_id or ""), inst.pipe_dir, owner):
            notes.append(f"{inst.name}: {inst.pipe_dir} (owner uid {owner}) was not made by "
                         "our Prolog for that job: not an orphan of ours, left alone")
            continue
        try:
            age = now - os.lstat(ctx.path(inst.pipe_dir)).st_mtime
        except OSError:
            age = float("inf")
        if age < min_age_s:
            notes.append(f"{inst.name}: its pipe dir is {age:.0f}s old (under "
                         f"{min_age_s:g}s, orphans.min_age_s): left for now")
        else:
            old.append(inst)
    return tuple(old), notes


def run(config: Config, root: str, dry_run: bool, say: Say) -> int:
    settings = remediation(config)
    ctx = Context(config, root)
    if config.mps.layout != "per-job":
        say(f"orphans: the {config.mps.layout} layout has no per-job instances: nothing to do")
        return DONE
    need_root(dry_run, "orphans")
    node = node_name(config)
    try:
        jobs = read_jobs(config, node, settings.term_timeout_s + 5.0)
    except SlurmError as e:
        raise Failure(f"cannot list the jobs on {node}, so no instance is judged an "
                      f"orphan: {e}", CANNOT) from None
    orphans, notes = find(ctx, jobs, time.time())
    say(f"orphans on {node}: {len(orphans)} (jobs Slurm lists here: "
        f"{', '.join(sorted(jobs)) or 'none'})")
    for note in notes:
        say(f"  note: {note}")
    for inst in orphans:
        say(f"  {inst.name} (job {inst.job_id}, pipe dir {inst.pipe_dir}):")
        for line in plan_lines(ctx, inst, settings):
            say(f"    - {line}")
    if not orphans:
        return DONE
    if dry_run:
        say("  dry run: nothing was changed")
        return DONE
    with lock_node(ctx, settings, "orphans"):
        # The job list again, under the lock: a job that arrived meanwhile keeps its dirs.
        try:
            jobs = read_jobs(config, node, settings.term_timeout_s + 5.0)
        except SlurmError as e:
            say(f"  cannot list the jobs again: {e}; nothing removed")
            return CANNOT
        return clean(ctx, tuple(i for i in orphans if i.job_id not in jobs), settings, say)

