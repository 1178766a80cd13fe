"""The HealthCheckProgram run: judge MPS, count, and drain or resume only when needed.

slurmd runs it as root with no arguments and an almost empty environment, every
HealthCheckInterval seconds and once before the node registers, and kills its process
group after 60 s. So: the whole run has a budget well below that (checks first, then
at most two bounded scontrol calls); a hung check is abandoned, not waited for; runs
never overlap (a flock); and slurmctld is asked nothing unless something must change.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import List, NamedTuple, Optional, Tuple

from mps_health.config.load import Config
from mps_health.config.remediation import (
    SLOW_RUN_S,
    SLURM_CALLS,
    SLURMD_KILL_S,
    HealthcheckSettings,
    healthcheck,
    remediation,
)
from mps_health.config.slurm import settings as slurm_settings
from mps_health.engine import run as engine
from mps_health.engine.actionhints import read_more
from mps_health.exporters import text
from mps_health.healthcheck import detach, slurmnode
from mps_health.healthcheck import state as hcstate
from mps_health.hostio.filelock import node_lock
from mps_health.model.facts import Facts
from mps_health.model.printable import printable
from mps_health.model.results import CRITICAL, STARTING, UNKNOWN, WARNING, Report, worst
from mps_health.probes.context import Context, node_name
from mps_health.remediation.audit import Audit, who

LOCK_NAME = "healthcheck"
# Its own codes, besides the checks' (runbook entries in docs/runbook.md): the checks hung; the
# fleet breaker held a drain; a drain or resume call failed; the run took too long.
CODES = ("healthcheck-timeout", "fleet-wide-fault", "healthcheck-slurm-failed",
         "healthcheck-slow")


class RunResult(NamedTuple):
    rc: int
    lines: Tuple[str, ...]


def reason_for(report: Optional[Report], hc: HealthcheckSettings, tag: str
               ) -> Tuple[str, str]:
    """(failure code, drain reason starting with ``tag``) for this run: its worst problem."""
    if report is None:
        return "healthcheck-timeout", slurmnode.reason_text(
            tag, "healthcheck-timeout:", "the MPS checks did not finish in time")
    bad = [p for p in report.problems() if p.state in (CRITICAL, WARNING)]
    wanted = [p for p in bad if p.state == CRITICAL or hc.drain_on != "critical"]
    if not wanted:
        return "unknown", slurmnode.reason_text(tag, "unknown:", "MPS check failed")
    r = min(wanted, key=lambda p: p.state != CRITICAL)  # the first critical, else warning
    where = f" {r.instance}" if r.instance else ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return r.code, slurmnode.reason_text(tag, f"{r.code}{where}:", r.message + more)


def drainable(report: Report, observe: Tuple[str, ...]) -> Report:
    """What the verdict is made of: the report without the checks in ``checks.observe``
    and without the findings any local user can cause (``slurmnode.BY_ANY_USER``)."""
    return report._replace(runs=tuple(
        run._replace(results=tuple(r for r in run.results if not slurmnode.by_any_user(r)))
        for run in report.runs if run.name not in observe))


def _slow(report: Optional[Report], took: float, slurm_s: float) -> List[str]:
    """The WARNING line of a run that took over ``SLOW_RUN_S``, naming its slowest part."""
    if took <= SLOW_RUN_S:
        return []
    parts = dict(report.gather_s) if report is not None else {}
    if slurm_s > 0:
        parts["slurmctld calls"] = slurm_s
    slowest = max(parts.items(), key=lambda kv: kv[1], default=None)
    where = f"; slowest: {printable(slowest[0])} {slowest[1]:.1f}s" if slowest else ""
    return [read_more(f"MPS WARNING - healthcheck-slow: this run took {took:.1f}s, over "
                      f"{SLOW_RUN_S:g}s (a quarter of slurmd's {SLURMD_KILL_S:g}s kill){where}",
                      "healthcheck-slow")]


def run_once(config: Config, root: str, dry_run: bool, environ: Optional[dict] = None
             ) -> RunResult:
    """One complete health check run (the caller holds the health check lock)."""
    started = time.monotonic()
    environ = dict(os.environ) if environ is None else environ
    hc, rem, slurm = healthcheck(config), remediation(config), slurm_settings(config)
    node = node_name(config, environ)
    rooted = Context(config, root).path  # a path as seen under --root
    # The checks' budget: what is left after the scontrol calls and a margin.
    budget = max(0.5, min(config.budget_s, hc.timeout_s - SLURM_CALLS * slurm.timeout_s - 1.0))
    report: Optional[Report] = None  # None: the run hung past its hard limit, the budget
    facts: Optional[Facts] = None
    with contextlib.suppress(engine.Overrun):  # walked away from, what it started killed
        facts, report = engine.run(config, root, budget_s=budget, boot_grace_s=hc.boot_grace_s)
    freed: List[str] = []
    if facts is not None and hc.unblock and not dry_run:
        # A daemon a local process holds is freed now, as 'remediate unblock' does, and
        # judged again: the node heals within the run and stays in service.
        freed = _unblock(config, root, facts, environ)
        left = hc.timeout_s - SLURM_CALLS * slurm.timeout_s - 1.0 - (time.monotonic() - started)
        if freed and left >= 0.5:
            with contextlib.suppress(engine.Overrun):
                report = engine.run(config, root, budget_s=min(budget, left),
                                    boot_grace_s=hc.boot_grace_s)[1]
    if report is None:
        state_code, booting, judged = CRITICAL, [], None
        lines = [read_more(f"MPS CRITICAL - healthcheck-timeout: the checks did not finish "
                           f"within {engine.limit_for(budget):.0f}s (a hung probe); "
                           "abandoned, not waited for", "healthcheck-timeout")]
    else:
        state_code, lines = report.state, [*text.render(report).splitlines(), *freed]
        # Found but never drained: what the engine marked starting (the node is within
        # healthcheck.boot_grace_s of its boot: results.STARTING_CODES), the checks in
        # checks.observe, and the findings any local user can cause.
        booting = sorted({f"{r.code}{' ' + r.instance if r.instance else ''}"
                          for run in report.runs for r in run.results if r.cause == STARTING})
        watched = sorted({r.check for r in report.problems() if r.check in config.checks.observe})
        by_users = sorted({r.code for r in report.problems() if slurmnode.by_any_user(r)})
        if booting:
            lines.append(f"MPS-HC: INITIALIZING - booted {engine.uptime_s(root) or 0:.0f}s ago "
                         f"(healthcheck.boot_grace_s {hc.boot_grace_s:g}): still starting, "
                         f"never drained: {', '.join(booting)}")
        if watched:
            lines.append(f"MPS-HC: observe only, never drains: {', '.join(watched)}")
        if by_users:
            lines.append("MPS-HC: a local user can cause these, so they never drain: "
                         f"{', '.join(by_users)}")
        judged = drainable(report, config.checks.observe)
    verdict = hcstate.verdict_of(CRITICAL if judged is None else judged.state, hc.drain_on)
    if booting and verdict == "pass":
        verdict = "starting"  # not clean either: a drain of ours is not resumed on it
    code, reason = reason_for(judged, hc, slurm.drain_tag) if verdict == "fail" else ("", "")
    state_path = os.path.join(rooted(config.state_dir), hcstate.STATE_FILE)
    # Where counting goes on while the state dir is full or read-only (tmpfs: lost at boot):
    # written only then, removed once the state dir takes it again; read while it exists.
    fallback = os.path.join(rooted(config.run_dir), hcstate.STATE_FILE)
    before = hcstate.load(fallback if os.path.lexists(fallback) else state_path)
    state = hcstate.count(before, verdict, code)
    healthy = hcstate.node_healthy_from_env(environ.get("SLURM_NODE_IS_HEALTHY"))
    now = time.time()
    fail_runs = hc.fail_runs
    if not dry_run:
        # Saved before deciding: a run that can keep no count anywhere must not wait for
        # a second failure that it could never see, so it drains on this one.
        saved_to, problem = hcstate.save_either(state_path, fallback, state)
        if problem:
            lines.append(f"MPS-HC: warning: {problem}" + (
                f"; counting in {saved_to} until it can" if saved_to else
                "; no count can be kept: a failed run drains at once"))
        if not saved_to:
            fail_runs = 1
    slurm_started = time.monotonic()  # what slurmctld costs this run, for healthcheck-slow
    if not state.known and verdict == "pass" and not dry_run:
        state, note = _relearn(config, node, slurm.drain_tag, slurm.timeout_s, state, healthy)
        lines.append(note)
    need = hcstate.decide(state, verdict, fail_runs, hc.pass_runs, hc.recheck_s, healthy, now)
    outcome, why = "none", need.why
    if need.action in ("drain", "resume") and dry_run:
        outcome, why = "dry-run", f"would {need.action}: {need.why}"
    elif need.action == "drain":
        breaker = slurmnode.fleet_breaker(node, slurm.drain_tag, hc.fleet_max_share,
                                          hc.fleet_max_nodes)
        outcome, why, _ = slurmnode.drain_if_allowed(config, node, slurm.drain_tag, reason,
                                                     slurm.timeout_s, breaker)
        if outcome == "held":
            state_code = CRITICAL
            lines.append(read_more(f"MPS CRITICAL - fleet-wide-fault: {why}: find the common "
                                   "cause (driver rollout, shared filesystem, a check's bug) "
                                   "before draining by hand", "fleet-wide-fault"))
        if outcome in ("drained", "already"):
            state = state._replace(drained=True, verified_at=now, known=True)
        elif outcome in ("left", "held"):
            state = state._replace(drained=False, known=True)
    elif need.action == "resume":
        outcome, why, _ = slurmnode.resume_if_ours(config, node, slurm.drain_tag,
                                                   slurm.timeout_s)
        if outcome in ("resumed", "left"):
            state = state._replace(drained=False)
    elif need.action == "forget":
        state = state._replace(drained=False)
    slurm_s = time.monotonic() - slurm_started
    if outcome == "error":
        # slurmctld slow or down: our own trouble, not the node's. Nothing was changed, the
        # state still says what is owed, and the next run asks again.
        state_code = worst([state_code, UNKNOWN])
        lines.append(read_more(f"MPS UNKNOWN - healthcheck-slurm-failed: the {need.action} "
                               f"was not done ({why}); the next run tries again",
                               "healthcheck-slurm-failed"))
    if outcome in ("drained", "resumed", "error", "held"):
        audit = Audit(rooted(rem.audit_log), rem.syslog, node, "healthcheck",
                      f"{who(environ)} via healthcheck")
        audit.record(need.action, {"error": "failed", "held": "held"}.get(outcome, "ok"),
                     reason=reason if need.action == "drain" else "", detail=why)
    took = time.monotonic() - started
    slow = _slow(report, took, slurm_s)
    if slow:
        state_code = worst([state_code, WARNING])
        lines += slow
    state = state._replace(duration_s=took)
    if not dry_run:
        hcstate.save_either(state_path, fallback, state)  # its trouble is said above
    ours = "drained by us" if state.drained else "not drained by us"
    lines.append(f"MPS-HC: {verdict}; failed {state.fails}/{hc.fail_runs}, clean "
                 f"{state.passes}/{hc.pass_runs}; node {ours}; {_said(need.action, outcome, why)}; "
                 f"took {took:.1f}s")
    return RunResult(state_code, tuple(lines))


def _unblock(config: Config, root: str, facts: Facts, environ: dict) -> List[str]:
    """Free each instance that a local process holds (``remediation.unblock``); a line
    for each, saying what was done."""
    from mps_health.remediation import unblock

    todo = {name: found for name, found in unblock.plans(facts).items()
            if any(b.remedy for b in found)}
    if not todo:
        return []
    rem = remediation(config)
    ctx = Context(config, root)
    audit = Audit(ctx.path(rem.audit_log), rem.syslog, node_name(config, environ),
                  "unblock", f"{who(environ)} via healthcheck")
    lines = []
    for inst in facts.instances:
        if inst.name in todo:
            freed = unblock.free(ctx, inst, todo[inst.name], lambda _line: None, audit,
                                 time.monotonic() + config.control.timeout_s)
            lines.append(f"MPS-HC: unblocked {printable(inst.name)}: "
                         f"{printable(unblock.summary(freed))}")
    return lines


def _relearn(config: Config, node: str, tag: str, timeout_s: float, state: hcstate.HcState,
             healthy: Optional[bool]) -> Tuple[hcstate.HcState, str]:
    """The memory was lost: read the node once to learn whether it carries our drain, so
    that a drain of ours is resumed after the usual clean runs, not never."""
    if healthy is True:  # Slurm says it is in service: nothing of ours to resume
        return state._replace(known=True), "MPS-HC: no saved state; Slurm says the node is " \
            "in service"
    try:
        view = slurmnode.read_node(config, node, timeout_s)
    except slurmnode.SlurmError as e:
        return state, f"MPS-HC: no saved state, and the node cannot be read ({e}): will retry"
    mine, why = slurmnode.may_resume(view, tag)
    if mine:
        return state._replace(drained=True, known=True), \
            f"MPS-HC: no saved state; the node is {why}: resumed after the usual clean runs"
    return state._replace(known=True), f"MPS-HC: no saved state; node not drained by us ({why})"


def _said(action: str, outcome: str, why: str) -> str:
    if action == "none" or outcome == "none":
        return why
    return {"error": f"{action} failed, will retry next run: {why}",
            "drained": f"drained ({why})", "resumed": f"resumed ({why})",
            "already": "already drained by us", "held": f"not drained: {why}",
            "dry-run": f"{action}: {why}"}.get(
        outcome, f"{'not drained' if action == 'drain' else 'not resumed'}: {why}")


def locked_run(config: Config, root: str, dry_run: bool) -> RunResult:
    """run_once under the health check lock; a run still going elsewhere wins."""
    run_dir = Context(config, root).path(config.run_dir)
    lock = node_lock(run_dir, LOCK_NAME)
    try:
        got = lock.try_acquire("healthcheck")
    except OSError as e:
        return RunResult(UNKNOWN, (f"MPS UNKNOWN - cannot take the health check lock in "
                                   f"{run_dir}: {e.strerror}",))
    if not got:
        return RunResult(0, ("MPS-HC: the previous health check is still running; this run "
                             "is skipped",))
    try:
        result = run_once(config, root, dry_run)
        if not dry_run:
            # The stored answer is a convenience for detached mode: never fatal.
            with contextlib.suppress(OSError):
                detach.write_result(os.path.join(run_dir, detach.RESULT_FILE), result.rc,
                                    detach.boot_id(), "\n".join(result.lines))
        return result
    finally:
        lock.release()


def detached(config: Config, root: str, hc: HealthcheckSettings) -> RunResult:
    """Answer with the stored result and refresh it in a detached child."""
    run_dir = Context(config, root).path(config.run_dir)
    stored = detach.current(detach.read_result(os.path.join(run_dir, detach.RESULT_FILE)),
                            detach.boot_id(), time.time(), hc.result_ttl_s)
    busy = node_lock(run_dir, LOCK_NAME)
    try:
        free = busy.try_acquire("healthcheck (probe)")
    except OSError:
        free = False
    busy.release()
    if free:
        detach.spawn(lambda: locked_run(config, root, dry_run=False).rc)
    note = "refreshing in the background" if free else "a check is already running"
    if stored is None:
        return RunResult(0, (f"MPS-HC: no current result (first run since boot, or expired); "
                             f"{note}",))
    age = time.time() - stored.written_at
    return RunResult(stored.rc, (*stored.text.splitlines(),
                                 f"MPS-HC: result from {age:.0f}s ago; {note}"))


def main_run(config: Config, root: str, dry_run: bool, mode: Optional[str]) -> RunResult:
    hc = healthcheck(config)
    if (mode or ("detached" if hc.detached else "foreground")) == "detached" and not dry_run:
        return detached(config, root, hc)
    return locked_run(config, root, dry_run)
