"""The run: gather the facts the chosen checks need, then judge them.

Sources that wait on other programs are not read in turn: the control query and the
servers probe start their clients first and are collected last; scontrol, NVML and the
canary run in threads. All are bound by the run's deadline; a source that misses it, or
fails, leaves one line in ``Facts.errors`` and makes only the checks needing it UNKNOWN.
The whole run also has a hard limit (``bounded``): past it the caller walks away from it
and every command it started is killed (``Overrun``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, TypeVar

from mps_health import __version__
from mps_health.config.load import Config
from mps_health.engine import actionhints, registry
from mps_health.hostio.resources import OutOfResources
from mps_health.model import results
from mps_health.model.exitcodes import Failure
from mps_health.model.facts import Facts, Instance
from mps_health.model.printable import printable
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, CheckRun, Report, Result, fold
from mps_health.probes import instances
from mps_health.probes.context import Context, joined, node_name

T = TypeVar("T")

# A blocking source needs a moment after ctx.deadline to turn "no answer" into a fact: a
# wedged daemon is CRITICAL (control-wedged), not UNKNOWN because its thread was given up.
JOIN_GRACE_S = 1.0
# The control query ends this long before the budget, so killing the client and taking
# its answer fit inside it.
CONTROL_MARGIN_S = 0.3
# With no outer limit the run is abandoned this long after its gathering budget.
OVERRUN_GRACE_S = 2.0
# The codes the engine itself reports for any check (runbook entries in docs/runbook.md).
CODES = ("facts-unavailable", "check-failed")


class SelectionError(Failure, ValueError):
    """--only/--skip or the config named a check that does not exist (exit 3)."""


class Overrun(Failure):
    """The run passed its hard limit and was abandoned, its commands killed (exit 3)."""

    def __init__(self, limit_s: float, waiting_on: Sequence[str], line: str = "") -> None:
        self.waiting_on = tuple(waiting_on)
        where = f" (still busy with: {', '.join(self.waiting_on)})" if self.waiting_on else ""
        super().__init__(line or f"the checks did not finish within {limit_s:g}s{where}: "
                         "something below mps-health hung (a hung file system, a process "
                         "stuck in the kernel); abandoned, the commands it started killed "
                         "(runbook: run-overrun)")


def limit_for(budget_s: float) -> float:
    return budget_s + OVERRUN_GRACE_S


def bounded(limit_s: float, work: Callable[[Set[str]], T], since: Optional[float] = None
            ) -> T:
    """``work(in_flight)``'s value, or Overrun ``limit_s`` seconds after ``since`` (default
    now). ``work`` runs in a daemon thread, so nothing it blocks on (a FIFO, a hung NFS
    read, D state) holds the caller; at the limit every command started meanwhile is
    killed. (SIGALRM cannot: a probe would catch it, and it reaches the main thread only.)"""
    started = time.monotonic() if since is None else since
    in_flight: Set[str] = set()
    box: List[T] = []
    failed: List[BaseException] = []
    ended: List[float] = []

    def target() -> None:
        try:
            box.append(work(in_flight))
        except BaseException as e:  # handed to the caller as it is
            failed.append(e)
        ended.append(time.monotonic())

    thread = threading.Thread(target=target, name="mps-health run", daemon=True)
    thread.start()
    # Work that ended past the limit (before this thread looked) did not finish within it.
    if not joined(thread, limit_s - (time.monotonic() - started)) \
            or ended[0] - started > limit_s:
        runner = sys.modules.get("mps_health.hostio.runner")  # not loaded: nothing was started
        if runner is not None:
            runner.kill_started_since(started)
        raise Overrun(limit_s, sorted(in_flight))
    if failed:
        raise failed[0]
    return box[0]


def select_checks(config: Config, only: Sequence[str] = (), skip: Sequence[str] = ()
                  ) -> List[registry.CheckSpec]:
    chosen = config.checks  # its names were checked when the config was loaded
    table = registry.checks()
    unknown = [name for name in (*only, *skip) if name not in table]
    if unknown:
        raise SelectionError(f"unknown check '{unknown[0]}' (known: {', '.join(sorted(table))})")
    if only or chosen.only:
        names = list(only or chosen.only)
    else:  # the defaults, those whose config section is present, and checks.enable
        names = [c.name for c in table.values()
                 if c.default_on or any(k in config.given for k in c.when_configured)
                 or c.name in chosen.enable]
    dropped = set(skip) | set(chosen.disable)
    return [table[n] for n in names if n not in dropped]


def budget_within(limit_s: float, configured_s: float) -> float:
    """The gathering budget of a run that must end within ``limit_s`` (check_mps' -t, the
    exporter's interval), leaving room for start-up, judging and printing."""
    return min(configured_s, max(0.5, limit_s * 0.8 - 0.2))


def fit_control(config: Config, budget_s: float) -> Config:
    """control.timeout_s ending CONTROL_MARGIN_S before the budget: a short budget still
    sees a wedged daemon as wedged, not as a missed deadline."""
    limit = round(max(0.1, budget_s - CONTROL_MARGIN_S), 3)
    if config.control.timeout_s <= limit:
        return config
    return config._replace(control=config.control._replace(timeout_s=limit))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if isinstance(exc, OutOfResources) and text:
        return text[0]  # already says what and why, in words
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def gather(ctx: Context, needs: Iterable[str], in_flight: Optional[Set[str]] = None,
           meanwhile: Optional[Callable[[], None]] = None) -> Facts:
    """Gather every needed source once; never raises, never outlives ``ctx.deadline``
    unless a read blocks below Python. ``meanwhile`` runs once the inline sources are read."""
    started = time.time()
    doing: Set[str] = set() if in_flight is None else in_flight
    needed = set(needs)
    wanted = [src for name, src in registry.SOURCES.items() if name in needed]
    values: Dict[str, object] = {}
    errors: Dict[str, str] = {}
    durations: Dict[str, float] = {}
    over = 0
    doing.add("instances")
    try:
        if ctx.config.mps.layout == "per-job":  # the other layouts never load the Slurm probe
            from mps_health.probes.slurm import with_jobs

            ctx = with_jobs(ctx)  # the one squeue, shared with the slurm source
        found = insts = instances.gather(ctx)
        insts, unjudged = _judged_now(ctx, insts, None, {})
        over = max(0, len(insts) - ctx.config.mps.max_instances)
        insts = insts[:ctx.config.mps.max_instances]
    except Exception as e:  # a bad template or unreadable /tmp: say so, judge the rest
        found, insts, unjudged = (), (), {}
        errors["instances"] = _one_line(e)
    doing.discard("instances")
    if "control" in needed or "servers" in needed:  # one timeout per wedged daemon
        from mps_health.probes.queries import Queries

        ctx = ctx._replace(queries=Queries())
    if "slurm" in needed and "canary" in needed:  # one node read for both
        from mps_health.probes.slurm import SharedRead

        ctx = ctx._replace(slurm_node=SharedRead())

    def collect(src: registry.Source, step: Callable[[], object]) -> None:
        t0 = time.monotonic()
        doing.add(src.name)
        try:
            values[src.name] = step()
        except Exception as e:  # one line for the user, UNKNOWN for the checks needing it
            values.pop(src.name, None)
            errors[src.name] = _one_line(e)
        durations[src.name] = durations.get(src.name, 0.0) + time.monotonic() - t0
        doing.discard(src.name)

    probes: Dict[str, registry.Probe] = {}
    for src in wanted:  # imported first: no two threads import at once
        try:
            probes[src.name] = src.probe()
        except Exception as e:  # one line for the user, UNKNOWN for the checks needing it
            errors[src.name] = _one_line(e)
    wanted = [src for src in wanted if src.name in probes]

    # A source with a start has its commands started first and is collected last, in the
    # registry's order (the control query's pipe dir locks before the servers wait).
    split = []
    for src in wanted:
        start = probes[src.name].start
        if start is not None:
            split.append(src)
            collect(src, functools.partial(start, ctx, insts))
    ending = {src.name: values.pop(src.name) for src in split if src.name in values}
    threads = []
    for src in wanted:
        if src.blocking:
            step = functools.partial(probes[src.name].gather, ctx, insts)
            t = threading.Thread(target=collect, args=(src, step), name=f"source {src.name}",
                                 daemon=True)
            t.start()
            threads.append((src, t))
    for src in wanted:
        if not (src.blocking or src in split):
            collect(src, functools.partial(probes[src.name].gather, ctx, insts))
    if meanwhile is not None:
        meanwhile()
    for src in split:
        if src.name in ending:  # (a start that failed said why in errors)
            collect(src, ending[src.name])  # type: ignore[arg-type]
    for src, t in threads:
        if not joined(t, ctx.remaining() + JOIN_GRACE_S):
            errors[src.name] = "did not finish within the run's budget"
    if "processes" in values and "dirs" in values:  # a daemon started since the scan
        from mps_health.probes.proc import with_named

        t0 = time.monotonic()
        with contextlib.suppress(Exception):  # else the scan stands: at worst a stale verdict
            values["processes"] = with_named(ctx, values["processes"],  # type: ignore[arg-type]
                                             values["dirs"])  # type: ignore[arg-type]
        durations["processes"] = durations.get("processes", 0.0) + time.monotonic() - t0
    # Once more with every fact in: what the facts saw of a hook's change is never judged.
    try:
        insts, unjudged = _judged_now(ctx, insts, started, unjudged)
    except Exception as e:  # cannot tell set-up from failure: judge none, say why
        errors["instances"] = _one_line(e)
    job_of = {i.name: i.job_id or i.name for i in found}
    return Facts(node_name(ctx.config, ctx.env), started, ctx.root, insts, dict(values),
                 errors, durations, over,
                 tuple(sorted((job_of.get(n, n), why) for n, why in unjudged.items())))


def _judged_now(ctx: Context, insts: Tuple[Instance, ...], since: Optional[float],
                known: Dict[str, str]) -> Tuple[Tuple[Instance, ...], Dict[str, str]]:
    """The per-job instances to judge (probes/jobphase.py), and those left out, with why."""
    if ctx.config.mps.layout != "per-job" or not insts:
        return insts, known
    from mps_health.probes.jobphase import unjudged

    why = {**known, **unjudged(ctx, insts, since)}
    return tuple(i for i in insts if i.name not in why), why


def job_scoped(found: Tuple[Result, ...], per_job: Set[str]) -> Tuple[Result, ...]:
    """Where a per-job instance's dirs or daemon are the job's user's, that user can break
    them at will, hurting only their own job: at most a WARNING, never a drain."""
    return tuple(r._replace(state=WARNING) if r.state == CRITICAL and r.instance in per_job
                 else r for r in found)


def shown(r: Result) -> Result:
    return r._replace(instance=printable(r.instance), message=printable(r.message),
                      action=printable(r.action),
                      labels=tuple((printable(k), printable(v)) for k, v in r.labels))


SNAPSHOT = ("mps-health", "snapshot")


def judge(facts: Facts, config: Config,
          checks: Sequence[registry.CheckSpec]) -> Tuple[CheckRun, ...]:
    """Run each check over the facts. A check never raises out of here."""
    runs: List[CheckRun] = []
    users_own = "job" in (config.mps.dir_owner, config.mps.daemon_user)
    per_job = {i.name for i in facts.instances if i.layout == "per-job" and users_own}
    for spec in checks:
        t0 = time.monotonic()
        missing = [n for n in spec.needs if n not in facts.sources]
        if "instances" in facts.errors:
            missing.insert(0, "instances")
        failed: Optional[str] = None
        if missing:
            why = "; ".join(f"{n}: {facts.errors.get(n, 'not gathered')}" for n in missing)
            found: Tuple[Result, ...] = (Result(
                spec.name, UNKNOWN, "facts-unavailable", "", f"cannot judge: {why}",
                f"run {actionhints.quoted(actionhints.VERBOSE)} as root",
                commands=(actionhints.VERBOSE,)),)
        else:
            try:
                fn: Callable[[Facts, Config], Iterable[Result]] = registry.load(spec.target)
                found = job_scoped(tuple(shown(r) for r in fn(facts, config)), per_job)
            except Exception as e:
                failed = _one_line(e)
                found = (Result(spec.name, UNKNOWN, "check-failed", "",
                                f"the check itself failed: {failed}",
                                f"report this as a bug with {actionhints.quoted(SNAPSHOT)}",
                                commands=(SNAPSHOT,)),)
        runs.append(CheckRun(spec.name, found, time.monotonic() - t0, failed))
    return fold(runs)  # a cause is one problem: what follows from it is folded under it


def run(config: Config, root: str = "/", only: Sequence[str] = (), skip: Sequence[str] = (),
        budget_s: Optional[float] = None, replay: Optional[Facts] = None,
        limit_s: Optional[float] = None, boot_grace_s: float = 0.0) -> Tuple[Facts, Report]:
    """Gather (or replay) and judge within ``limit_s``. Within ``boot_grace_s`` of boot (not
    for a replay), what only says a unit is not up yet is marked starting."""
    t0 = time.monotonic()
    checks = select_checks(config, only, skip)
    budget = budget_s if budget_s is not None else config.budget_s
    limit = limit_s if limit_s is not None else limit_for(budget)

    work = functools.partial(_run, config, root, checks, budget, replay, t0,
                             boot_grace_s=boot_grace_s)
    try:
        return bounded(limit, work, since=t0)
    except Overrun as e:
        if replay is None:
            raise
        raise Overrun(limit, e.waiting_on, f"judging the replayed snapshot "
                      f"({len(replay.instances)} instances) did not finish within {limit:g}s: "
                      "a snapshot this large needs more time: give --budget SECONDS (up to "
                      "300) (runbook: run-overrun)") from None


def cooling(runs: Sequence[CheckRun], facts: Facts, config: Config) -> Tuple[CheckRun, ...]:
    """``actionhints.cooling`` from the run's facts: the servers source already carries
    the resets mps-health recorded (``hostio/planned.py``), so no file is read again; a
    run without it says nothing of the cooldown (the reset itself still does)."""
    planned = getattr(facts.sources.get("servers"), "planned", None)
    if not planned:
        return tuple(runs)
    from mps_health.config.remediation import remediation
    from mps_health.hostio.planned import last_reset

    settings = remediation(config)
    return actionhints.cooling(runs, last_reset(planned)[0], settings.cooldown_s,
                               facts.taken_at, {i.name: i.log_dir for i in facts.instances},
                               settings.audit_log)


def uptime_s(root: str) -> Optional[float]:
    """Seconds since boot (``/proc/uptime``, under ``--root``); None when unreadable."""
    from mps_health.hostio.safefiles import read_small

    where = "/proc/uptime" if root in ("", "/") else f"{root.rstrip('/')}/proc/uptime"
    try:
        data = read_small(where, 256)
        return float(data.split()[0]) if data else None
    except (OSError, ValueError, IndexError):
        return None


def facts_within(config: Config, root: str, needs: Iterable[str], budget_s: float) -> Facts:
    """``gather`` under a run's hard limit, for snapshot and clients."""
    wanted = list(needs)
    return bounded(limit_for(budget_s), lambda in_flight: gather(
        Context(config, root, time.monotonic() + budget_s), wanted, in_flight))


def _run(config: Config, root: str, checks: List[registry.CheckSpec], budget: float,
         replay: Optional[Facts], t0: float, in_flight: Set[str], boot_grace_s: float = 0.0
         ) -> Tuple[Facts, Report]:
    if replay is None:
        config = fit_control(config, budget)
        facts = gather(Context(config, root, t0 + budget), [n for c in checks for n in c.needs],
                       in_flight)
    else:  # a check added after the snapshot was taken is left out, not UNKNOWN
        facts = replay
        checks = [c for c in checks
                  if all(n in facts.sources or n in facts.errors for n in c.needs)]
    in_flight.add("judging")
    runs = judge(facts, config, checks)
    in_flight.discard("judging")
    if boot_grace_s > 0 and replay is None and (up := uptime_s(root)) is not None \
            and up < boot_grace_s:
        runs = results.starting(runs)
    runs = cooling(runs, facts, config)
    # Every command an action quotes acts on what this run judged (its --config, --root).
    options = actionhints.run_options(config.path, root)
    runs = actionhints.applied(runs, options, CODES)
    report = Report(printable(facts.node), facts.taken_at, time.monotonic() - t0, runs,
                    dict(facts.durations), __version__,
                    {i.name: i.gpu for i in facts.instances if i.gpu}, options)
    return facts, report
