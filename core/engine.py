"""The run: gather the facts the chosen checks need, then judge them.

Sources that wait on other programs (the control client, scontrol) run in threads of
their own against the run's deadline; a source that misses it, or fails, leaves one
line in ``Facts.errors`` and makes only the checks that need it UNKNOWN, so one wedged
daemon never hides the other results.
"""

from __future__ import annotations

import threading
import time

from . import __version__, instances, registry
from .config import Config
from .context import Context, node_name
from .exitcodes import Failure
from .facts import Facts, Instance
from .printable import printable
from .results import CRITICAL, UNKNOWN, WARNING, CheckRun, Report, Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

# A blocking source bounds its own commands by ctx.deadline (the runner kills them then)
# and needs a moment after that to turn "no answer" into a fact: a wedged daemon must be
# judged CRITICAL (control-wedged), not UNKNOWN because its thread was given up on first.
JOIN_GRACE_S = 1.0
# The control query ends this long before the budget, so killing the client and
# collecting its answer fit inside it: a wedged daemon is judged, not lost to the deadline.
CONTROL_MARGIN_S = 0.3
# The codes the engine itself reports for any check (runbook entries in README.md).
CODES = ("facts-unavailable", "check-failed")


class SelectionError(Failure, ValueError):
    """--only/--skip or the config named a check that does not exist (exit 3)."""


def select_checks(config: Config, only: Sequence[str] = (), skip: Sequence[str] = ()
                  ) -> List[registry.CheckSpec]:
    chosen = config.checks  # its names were checked when the config was loaded
    for name in (*only, *skip):
        if name not in registry.CHECKS:
            known = ", ".join(sorted(registry.CHECKS))
            raise SelectionError(f"unknown check '{name}' (known: {known})")
    if only or chosen.only:
        names = list(only or chosen.only)
    else:  # the defaults, those whose config section is present, and checks.enable
        names = [c.name for c in registry.CHECKS.values()
                 if c.default_on or any(k in config.given for k in c.when_configured)
                 or c.name in chosen.enable]
    dropped = set(skip) | set(chosen.disable)
    return [registry.CHECKS[n] for n in names if n not in dropped]


def budget_within(limit_s: float, configured_s: float) -> float:
    """The gathering budget of a run that must be over within ``limit_s`` (check_mps' -t,
    the exporter's interval): room left for start-up, judging and printing."""
    return min(configured_s, max(0.5, limit_s * 0.8 - 0.2))


def fit_control(config: Config, budget_s: float) -> Config:
    """``config`` with control.timeout_s ending ``CONTROL_MARGIN_S`` before ``budget_s``:
    a budget shorter than the control timeout still sees a wedged daemon as wedged
    (CRITICAL control-wedged), not as a source that missed the deadline (UNKNOWN)."""
    limit = round(max(0.1, budget_s - CONTROL_MARGIN_S), 3)
    if config.control.timeout_s <= limit:
        return config
    return config._replace(control=config.control._replace(timeout_s=limit))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def gather(ctx: Context, needs: Iterable[str]) -> Facts:
    """Gather every needed source once; never raises, never outlives ``ctx.deadline``."""
    started = time.time()
    wanted = [registry.SOURCES[n] for n in dict.fromkeys(needs) if n in registry.SOURCES]
    values: Dict[str, object] = {}
    errors: Dict[str, str] = {}
    durations: Dict[str, float] = {}
    over = 0
    try:
        if ctx.config.mps.layout == "per-job":  # the other layouts never load the Slurm probe
            from .probes.slurm import with_jobs

            ctx = with_jobs(ctx)  # the one squeue, shared with the slurm source
        found = insts = instances.gather(ctx)
        insts, unjudged = _judged_now(ctx, insts, None, {})
        over = max(0, len(insts) - ctx.config.mps.max_instances)
        insts = insts[:ctx.config.mps.max_instances]
    except Exception as e:  # a bad template or unreadable /tmp: say so, judge the rest
        found, insts, unjudged = (), (), {}
        errors["instances"] = _one_line(e)

    def collect(src: registry.Source) -> None:
        t0 = time.monotonic()
        try:
            values[src.name] = registry.load(src.target)(ctx, insts)
        except Exception as e:  # one line for the user, UNKNOWN for the checks needing it
            errors[src.name] = _one_line(e)
        durations[src.name] = time.monotonic() - t0

    threads: List[Tuple[registry.Source, threading.Thread]] = []
    for src in wanted:
        if src.blocking:
            t = threading.Thread(target=collect, args=(src,), daemon=True)
            t.start()
            threads.append((src, t))
    for src in wanted:
        if not src.blocking:
            collect(src)
    for src, t in threads:
        t.join(ctx.remaining() + JOIN_GRACE_S)
        if t.is_alive():
            errors[src.name] = "did not finish within the run's budget"
    # Once more with every fact in: a hook that changed an instance meanwhile recorded it
    # before acting, so what the facts saw of that change is never judged.
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
    """The per-job instances to judge (core/jobphase.py), and those left out, with why."""
    if ctx.config.mps.layout != "per-job" or not insts:
        return insts, known
    from .jobphase import unjudged

    why = {**known, **unjudged(ctx, insts, since)}
    return tuple(i for i in insts if i.name not in why), why


def job_scoped(results: Tuple[Result, ...], per_job: Set[str]) -> Tuple[Result, ...]:
    """Where a per-job instance's dirs or daemon belong to the job's user, that user can
    break them at will; it hurts only their own job, so it is at most a WARNING, never a
    drain."""
    return tuple(r._replace(state=WARNING) if r.state == CRITICAL and r.instance in per_job
                 else r for r in results)


def shown(r: Result) -> Result:
    """``r`` with everything it took from the system made printable (see printable.py)."""
    return r._replace(instance=printable(r.instance), message=printable(r.message),
                      action=printable(r.action),
                      labels=tuple((printable(k), printable(v)) for k, v in r.labels))


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
        if missing:
            why = "; ".join(f"{n}: {facts.errors.get(n, 'not gathered')}" for n in missing)
            result = Result(spec.name, UNKNOWN, "facts-unavailable", "",
                            f"cannot judge: {why}", "run 'mps-health check -v' as root")
            runs.append(CheckRun(spec.name, (result,), time.monotonic() - t0))
            continue
        try:
            fn: Callable[[Facts, Config], Iterable[Result]] = registry.load(spec.target)
            results = job_scoped(tuple(shown(r) for r in fn(facts, config)), per_job)
            runs.append(CheckRun(spec.name, results, time.monotonic() - t0))
        except Exception as e:
            result = Result(spec.name, UNKNOWN, "check-failed", "",
                            f"the check itself failed: {_one_line(e)}",
                            "report this as a bug with 'mps-health snapshot'")
            runs.append(CheckRun(spec.name, (result,), time.monotonic() - t0, _one_line(e)))
    return tuple(runs)


def run(config: Config, root: str = "/", only: Sequence[str] = (), skip: Sequence[str] = (),
        budget_s: Optional[float] = None, replay: Optional[Facts] = None
        ) -> Tuple[Facts, Report]:
    """Gather (or replay) and judge. Raises SelectionError for unknown check names."""
    t0 = time.monotonic()
    checks = select_checks(config, only, skip)
    if replay is None:
        budget = budget_s if budget_s is not None else config.budget_s
        config = fit_control(config, budget)
        ctx = Context(config, root, t0 + budget)
        facts = gather(ctx, [n for c in checks for n in c.needs])
    else:
        facts = replay
        # A snapshot judges only what it holds: a check added after it was taken is left
        # out rather than reported UNKNOWN.
        checks = [c for c in checks
                  if all(n in facts.sources or n in facts.errors for n in c.needs)]
    runs = judge(facts, config, checks)
    report = Report(printable(facts.node), facts.taken_at, time.monotonic() - t0, runs,
                    dict(facts.durations), __version__,
                    {i.name: i.gpu for i in facts.instances if i.gpu})
    return facts, report

