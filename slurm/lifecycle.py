"""The per-job MPS life cycle: what the Prolog, TaskProlog and Epilog do.

Prolog (root): for a job that gets MPS, make its log and pipe dirs (safedirs: no symlink
followed, nothing planted accepted) owned by the job's user (log dir ``mps.log_dir_mode``,
0700: only the job's daemon writes there), its control.log and server.log the user's
regular files or out of the way (``keep_files``); start ``nvidia-cuda-mps-control -d`` as
that user with the job's GPUs and wait until it answers. On failure, undo what was made,
then fail (Slurm drains the node, requeues the job) or go on without MPS
(``jobs.on_start_failure``).

TaskProlog (the job's user): print ``export CUDA_MPS_PIPE_DIRECTORY=...`` (and the log
dir) when the job's pipe dir is a real dir of this user.

Epilog (root, also after scancel): ``quit -t N`` as the job's user, end what is left by
verified PID, remove the dirs whatever they hold (``safedirs.remove_tree``), drop the job's
record (``hostio.jobrecords``: only recorded dirs are ever judged orphans). It exits 0 for
any problem it can log; only a process surviving SIGKILL (stuck in the driver) fails it:
that node needs a person.
"""

import os
from typing import Dict, List, Mapping, NamedTuple, Optional, TextIO, Tuple

from mps_health.config.jobs import JobsSettings
from mps_health.config.load import SUN_PATH_MAX, Config, socket_path_bytes
from mps_health.config.templates import expand, match
from mps_health.hostio import jobrecords, safedirs
from mps_health.hostio.planned import record as record_planned
from mps_health.hostio.runas import RunAs, for_user, user_env
from mps_health.model.facts import ProcessFact
from mps_health.model.facts_deep import LOG_FILES
from mps_health.probes.jobphase import SETUP_DONE, SETUP_START, TEARDOWN
from mps_health.probes.proc import read_processes
from mps_health.probes.process_identity import CONTROL, binaries_for, is_daemon, locate, not_found
from mps_health.remediation import processes
from mps_health.remediation.daemonctl import quit_daemon, start_daemon
from mps_health.slurm.hooklog import HookLog
from mps_health.slurm.jobenv import JobEnv, parse_gpus, wants_daemon

# Many jobs ending at once queue for the records' lock; a record lost would let the
# health check judge a set-up or tear-down, so a hook waits longer than a check would.
RECORD_WAIT_S = 10.0


class JobDirs(NamedTuple):
    pipe_dir: str
    log_dir: str
    gpus: Tuple[str, ...]  # the GPUs this daemon is given (CUDA_VISIBLE_DEVICES)


def job_dirs(config: Config, job_id: str, gpus: Tuple[str, ...]) -> Tuple[JobDirs, ...]:
    """The dirs the job's daemons use: one set, or one per GPU when the template has {gpu}."""
    mps = config.mps
    each = gpus if "{gpu}" in mps.pipe_dir else ("",)
    return tuple(JobDirs(expand(mps.pipe_dir, job_id, g), expand(mps.log_dir, job_id, g),
                         (g,) if g else gpus) for g in each)


def found_job_dirs(config: Config, job_id: str, gpus: Tuple[str, ...]) -> Tuple[JobDirs, ...]:
    """The job's dirs from the template and, with {gpu}, also any found on disk."""
    expected = list(job_dirs(config, job_id, gpus))
    if "{gpu}" in config.mps.pipe_dir:
        parent = os.path.dirname(config.mps.pipe_dir)
        known = {d.pipe_dir for d in expected}
        for name in _names(parent):
            fields = match(config.mps.pipe_dir, name)
            pipe = os.path.join(parent, name)
            if fields is not None and fields[0] == job_id and pipe not in known:
                expected.append(JobDirs(pipe, expand(config.mps.log_dir, job_id, fields[1]),
                                        (fields[1],)))
    return tuple(expected)


def daemon_env(job: JobEnv, dirs: JobDirs, as_user: RunAs) -> Dict[str, str]:
    extra = {"CUDA_VISIBLE_DEVICES": ",".join(dirs.gpus),
             "CUDA_MPS_PIPE_DIRECTORY": dirs.pipe_dir,
             "CUDA_MPS_LOG_DIRECTORY": dirs.log_dir}
    if job.mps_percentage is not None:
        # The daemon's default for its servers: the job's gres/mps share.
        extra["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = job.mps_percentage
    return user_env(as_user, job.user, extra)


# --- Prolog ---------------------------------------------------------------------------
def prolog(job: JobEnv, config: Config, settings: JobsSettings, log: HookLog,
           proc_dir: str = "/proc") -> int:
    if not wants_daemon(job, settings.start_for):
        return 0
    if config.mps.layout != "per-job":
        log.warning(f"mps.layout is {config.mps.layout} in {config.path}: the per-job "
                    "prolog starts nothing (set mps.layout: per-job, or take the hooks out "
                    "of slurm.conf: `mps-health slurm install` writes none for this layout)")
        return 0
    failure = _start_all(job, config, settings, log, proc_dir)
    if failure is None:
        return 0
    log.error(failure)
    leftovers = cleanup(job, config, settings, log, proc_dir, by=TEARDOWN[1])  # an undo
    if leftovers:
        log.error("could not clean up after the failed start: " + leftovers)
    if settings.on_start_failure == "fail":
        log.error("exit 1: Slurm drains the node and requeues the job "
                  "(jobs.on_start_failure: fail)")
        return 1
    log.warning("the job runs without MPS (jobs.on_start_failure: continue)")
    return 0


def _start_all(job: JobEnv, config: Config, settings: JobsSettings, log: HookLog,
               proc_dir: str) -> Optional[str]:
    """Make the dirs and start each daemon; None, or the one line saying what failed."""
    if job.uid == 0 and config.mps.forbid_root_daemon:
        return "the job runs as root and mps.forbid_root_daemon is set: no daemon started"
    control = locate(config)  # as the check finds it: never slurmd's (empty) PATH
    if control is None:
        return (f"{not_found(config)}: install the NVIDIA driver's MPS binaries, or set "
                f"commands.{CONTROL} to its absolute path")
    as_user = for_user(job.uid, job.gid, job.user)
    for dirs in job_dirs(config, job.job_id, job.gpus):
        if socket_path_bytes(dirs.pipe_dir) > SUN_PATH_MAX:
            return (f"{dirs.pipe_dir} is too long for the daemon's unix sockets "
                    f"({socket_path_bytes(dirs.pipe_dir)} bytes, limit {SUN_PATH_MAX})")
        # Recorded before the dirs exist: the health check judges no instance our
        # Prolog is still setting up (mps_health.probes.jobphase).
        _record(config, dirs.pipe_dir, SETUP_START, log)
        # Whose dirs these are, before they exist: a Prolog killed after its mkdir leaves
        # no dir the orphans check could not tell from a stranger's.
        unrecorded = jobrecords.add(config.state_dir, job.job_id, job.uid,
                                    (dirs.log_dir, dirs.pipe_dir), RECORD_WAIT_S)
        if unrecorded:
            log.warning(unrecorded)
        for path, mode in ((dirs.log_dir, config.mps.log_dir_mode),
                           (dirs.pipe_dir, config.mps.dir_mode)):
            try:
                note = make_job_dir(path, job.uid, job.gid, mode)
            except OSError as e:
                return f"cannot make {path}: {e.strerror or e}"
            if note:
                log.warning(note)
        # The daemon appends to these as the job's user: nothing planted leads where that
        # user could not write anyway, so a dir we cannot check is a warning, not a drain.
        try:
            for note in safedirs.keep_files(dirs.log_dir, (job.uid,), LOG_FILES):
                log.warning(note)
        except OSError as e:
            log.warning(f"cannot check the logs in {dirs.log_dir}: {e.strerror or e}")
        started = start_daemon(control, dirs.pipe_dir, as_user,
                               daemon_env(job, dirs, as_user), settings.start_timeout_s,
                               proc_dir)
        if started.pid is None:
            return f"MPS daemon for GPUs {','.join(dirs.gpus)} did not start: {started.detail}"
        log.info(f"started MPS daemon {started.pid} as {job.user} for GPUs "
                 f"{','.join(dirs.gpus)} in {dirs.pipe_dir} ({started.elapsed_s:.2f}s)")
        _record(config, dirs.pipe_dir, SETUP_DONE, log, started.pid, started.start_ticks)
    return None


def _record(config: Config, pipe_dir: str, step: str, log: HookLog,
            pid: Optional[int] = None, start: Optional[int] = None) -> None:
    """Record a step of ours on the job's MPS (mps_health.hostio.planned): the daemon's change
    is then no alarm, and the health check leaves the instance alone meanwhile."""
    unrecorded = record_planned(config.state_dir, pipe_dir, step, pid, start, RECORD_WAIT_S)
    if unrecorded:
        log.warning(unrecorded)


# --- TaskProlog -----------------------------------------------------------------------
def task_gpu(env: Mapping[str, str]) -> Optional[str]:
    """The one GPU of a task (for {gpu} templates): SLURM_STEP_GPUS, else CUDA_VISIBLE_DEVICES."""
    for name in ("SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        try:
            gpus = parse_gpus(env.get(name, ""))
        except ValueError:
            continue
        if len(gpus) == 1:
            return gpus[0]
    return None


def task_exports(env: Mapping[str, str], config: Config, uid: int,
                 log: Optional[HookLog] = None) -> List[str]:
    """The ``export`` lines for a task of this job (none when it has no daemon of ours)."""
    job_id = env.get("SLURM_JOB_ID", "")
    if config.mps.layout != "per-job" or not job_id.isdigit():
        return []
    if env.get("SLURM_JOB_UID", str(uid)) != str(uid):
        return []  # run for another user's job: never point a task at someone's dir
    gpu = ""
    if "{gpu}" in config.mps.pipe_dir:
        gpu = task_gpu(env) or ""
        if not gpu:
            if log is not None:
                log.warning("one MPS daemon per GPU, but this task sees several GPUs (or "
                            "none): CUDA_MPS_PIPE_DIRECTORY not set; bind one GPU per task")
            return []
    pipe = expand(config.mps.pipe_dir, job_id, gpu)
    if not safedirs.owned_dir(pipe, uid):
        return []
    lines = [f"export CUDA_MPS_PIPE_DIRECTORY={pipe}"]
    logs = expand(config.mps.log_dir, job_id, gpu)
    if safedirs.owned_dir(logs, uid):
        lines.append(f"export CUDA_MPS_LOG_DIRECTORY={logs}")
    return lines


def task_prolog(env: Mapping[str, str], config: Config, out: TextIO,
                log: Optional[HookLog] = None) -> int:
    for line in task_exports(env, config, os.getuid(), log):
        out.write(line + "\n")
    out.flush()
    return 0


# --- Epilog ---------------------------------------------------------------------------
def epilog(job: JobEnv, config: Config, settings: JobsSettings, log: HookLog,
           proc_dir: str = "/proc") -> int:
    if config.mps.layout != "per-job":
        return 0
    stuck = cleanup(job, config, settings, log, proc_dir, by=TEARDOWN[0])
    if stuck:
        log.error(stuck + ": exit 1 so that Slurm drains the node")
        return 1
    return 0


def cleanup(job: JobEnv, config: Config, settings: JobsSettings, log: HookLog,
            proc_dir: str = "/proc", by: str = TEARDOWN[0]) -> str:
    """Quit, end and remove everything of the job; "" or the processes that survived."""
    all_dirs = found_job_dirs(config, job.job_id, job.gpus)
    pipes = {d.pipe_dir for d in all_dirs}
    procs = sum(processes.of_pipe_dirs(
        read_processes(proc_dir, binaries_for(config)), pipes), ())
    if not procs and not any(os.path.lexists(p) for d in all_dirs
                             for p in (d.pipe_dir, d.log_dir)):
        _forget(config, job.job_id, [], log)  # gone already: no name may stay ours
        return ""
    for pipe in sorted(pipes):  # before the first quit: a tear-down is never judged
        _record(config, pipe, by, log)
    as_user = for_user(job.uid, job.gid, job.user)
    control = locate(config)
    for dirs in all_dirs:
        daemon = [p for p in procs if is_daemon(p) and p.pipe_dir == dirs.pipe_dir]
        if not daemon or control is None:
            continue
        if daemon[0].state in ("T", "t", "D"):
            log.warning(f"daemon {daemon[0].pid} is in state {daemon[0].state}: not asking "
                        "it to quit (the client would hang); ending it")
            continue
        problem = quit_daemon(control, as_user, daemon_env(job, dirs, as_user),
                              settings.quit_timeout_s, settings.quit_timeout_s + 5.0)
        if problem:
            log.warning(f"daemon {daemon[0].pid} in {dirs.pipe_dir}: {problem}")
    processes.wait_gone(proc_dir, procs, 1.0)
    stuck = _end_leftovers(job, procs, settings, log, proc_dir)
    kept: List[str] = []
    for dirs in all_dirs:
        for path in (dirs.pipe_dir, dirs.log_dir):
            left = remove_job_dir(path, (job.uid, 0))
            if left:
                log.warning(left)
                if os.path.lexists(path):
                    kept.append(path)
    _forget(config, job.job_id, kept, log)
    if procs or all_dirs:
        log.info(f"cleaned up MPS for the job ({len(procs)} process(es), "
                 f"dirs {', '.join(sorted(pipes))})")
    return stuck


def _forget(config: Config, job_id: str, kept: List[str], log: HookLog) -> None:
    """Drop the job's record once its dirs are gone; a dir left keeps it, for the orphans
    check and 'remediate orphans' to judge. No write when there is nothing to drop."""
    records, _ = jobrecords.load(config.state_dir)
    if not any(r.job_id == job_id for r in records):
        return
    unrecorded = jobrecords.drop(config.state_dir, job_id, kept, RECORD_WAIT_S)
    if unrecorded:
        log.warning(unrecorded)


def _end_leftovers(job: JobEnv, procs: Tuple[ProcessFact, ...], settings: JobsSettings,
                   log: HookLog, proc_dir: str) -> str:
    left = [p for p in procs if processes.same(proc_dir, p)]
    foreign = [p for p in left if p.uid != job.uid]
    for p in foreign:
        log.warning(f"{p.role} {p.pid} serves this job's pipe dir but runs as uid {p.uid}, "
                    "not the job's user: left alone")
    mine = [p for p in left if p.uid == job.uid]
    if not mine:
        return ""
    results = processes.end_all(proc_dir, mine, settings.kill_grace_s, kill_wait_s=2.0)
    ended = [p for p, e in zip(mine, results) if e.outcome in ("terminated", "killed")]
    survivors = [p for p, e in zip(mine, results) if e.outcome == "alive"]
    if ended:
        log.warning("ended leftover MPS processes by verified PID: "
                    + ", ".join(f"{p.role} {p.pid}" for p in ended))
    if survivors:
        return "MPS processes survived SIGKILL (stuck in the driver?): " + ", ".join(
            f"{p.role} {p.pid}" for p in survivors)
    return ""


def make_job_dir(path: str, uid: int, gid: int, mode: int) -> str:
    """Make the job's dir ``path`` for ``uid``:``gid``; "" or a line about what was in the
    way. The user's own dir (or root's, from an earlier prolog of this job) is reused."""
    parent, name = safedirs.split(path)
    pfd = safedirs.open_dir(parent)
    try:
        made = safedirs.ensure_dir(pfd, name, mode, uid, gid, lambda e: e.uid in (uid, 0))
    finally:
        os.close(pfd)
    os.close(made.fd)
    if made.aside is None:
        return ""
    new, was = made.aside
    return (f"{path} was a {was.kind} owned by uid {was.uid}, not this job's: moved aside "
            f"to {parent.rstrip('/')}/{new}")


def remove_job_dir(path: str, owners: Tuple[int, ...]) -> str:
    """Remove the job's dir and all it holds, following no link; "" or what went wrong.
    Only an entry of ``owners`` is removed: a dir planted later is left for the admin."""
    try:
        parent, name = safedirs.split(path)
        pfd = safedirs.open_dir(parent)
    except OSError as e:
        return str(e)
    try:
        return "; ".join(safedirs.remove_tree(pfd, name, path, owners))
    finally:
        os.close(pfd)


def _names(parent: str) -> List[str]:
    try:
        fd = safedirs.open_dir(parent)
    except OSError:
        return []
    try:
        return safedirs.list_names(fd)
    finally:
        os.close(fd)
