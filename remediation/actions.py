"""What each ``mps-health remediate`` action does around its work: choose the instance,
print the plan, stop there on --dry-run, otherwise take the node lock, act, and leave
an audit trail. Exit codes: 0 done (or nothing to do), 1 refused (nothing changed;
--force overrides), 2 acted but failed, 3 could not start (config, usage, lock, rights).
"""

import contextlib
import os
import time
from typing import ContextManager, Optional, Sequence, Tuple

from mps_health.config.load import Config
from mps_health.config.remediation import RemediationSettings, remediation
from mps_health.engine.actionhints import Advice, run_options, with_options
from mps_health.hostio import planned
from mps_health.hostio.executable import why_not_runnable
from mps_health.hostio.filelock import LockBusy, node_lock
from mps_health.hostio.users import UserError, resolve
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.facts import Instance
from mps_health.model.printable import escape
from mps_health.model.results import STATE_NAMES
from mps_health.probes import instances
from mps_health.probes.context import Context, node_name
from mps_health.probes.process_identity import locate, not_found
from mps_health.probes.slurm import SlurmError, read_jobs, with_jobs
from mps_health.remediation import reset as reset_mod
from mps_health.remediation import unblock as unblock_mod
from mps_health.remediation.audit import Audit
from mps_health.remediation.dirs import DirTarget
from mps_health.remediation.reset import Say

DONE, REFUSED, FAILED, CANNOT = 0, 1, 2, 3


def audit_for(ctx: Context, settings: RemediationSettings, action: str) -> Audit:
    return Audit(ctx.path(settings.audit_log), settings.syslog, node_name(ctx.config), action)


def lock_node(ctx: Context, settings: RemediationSettings, what: str, dry_run: bool = False
              ) -> ContextManager[object]:
    """The node's remediation lock, released when the ``with`` block ends; none for a dry
    run, which changes nothing."""
    if dry_run:
        return contextlib.nullcontext()
    try:
        return node_lock(ctx.path(ctx.config.run_dir)).acquire(settings.lock_wait_s, what)
    except LockBusy as e:
        raise Failure(str(e), CANNOT) from None
    except OSError as e:
        raise Failure(f"cannot take the remediation lock in {ctx.config.run_dir}: "
                      f"{e.strerror}", CANNOT) from None


def need_root(dry_run: bool, action: str) -> None:
    if not dry_run and os.geteuid() != 0:
        raise Failure(f"{action} must run as root (add --dry-run to see the plan)", CANNOT)


def choose(ctx: Context, wanted: Sequence[str], every: bool = True,
           found: Optional[Tuple[Instance, ...]] = None, doing: str = "") -> Tuple[Instance, ...]:
    """The instances to act on: those named, in the order given; without names all of
    ``found`` (the node's, gathered here when not given) if ``every`` or there is one."""
    if found is None:
        found = instances.gather(with_jobs(ctx))
    names = ", ".join(i.name for i in found) or "none"
    known = {i.name: i for i in found}
    for name in wanted:
        if name not in known:
            raise Failure(f"no MPS instance named '{name}' on this node (known: {names})",
                          CANNOT)
    if wanted:
        return tuple(known[n] for n in dict.fromkeys(wanted))
    if every or len(found) == 1:
        if not found:
            raise Failure(f"no MPS instance on this node{doing}", CANNOT)
        return found
    raise Failure(f"name the instance{doing} ({names}), or give --all", CANNOT)


def target_for(ctx: Context, inst: Instance, settings: RemediationSettings) -> reset_mod.Target:
    mps = ctx.config.mps
    job_uid = None
    if "job" in (mps.dir_owner, mps.daemon_user) and inst.job_id is not None:
        try:
            jobs = read_jobs(ctx.config, node_name(ctx.config), settings.term_timeout_s + 5)
        except SlurmError as e:
            raise Failure(f"cannot tell the user of job {inst.job_id}: {e}", CANNOT) from None
        job = jobs.get(inst.job_id)
        if job is None:
            raise Failure(f"job {inst.job_id} is not on this node any more: its instance "
                          "is an orphan; see 'mps-health remediate orphans'", CANNOT)
        job_uid = job.uid
    try:
        owner = resolve(mps.dir_owner, job_uid, "mps.dir_owner")
        daemon_user = resolve(mps.daemon_user, job_uid, "mps.daemon_user")
    except UserError as e:
        raise Failure(str(e), CANNOT) from None
    trusted = frozenset({0, owner.uid, daemon_user.uid})
    uid, gid = (None, None) if mps.dir_owner == "any" else (owner.uid, owner.gid)
    # The log dir is the daemon's user's (only the daemon writes there: its mode lets no
    # one else); as the pipe dir when any user may run the daemon.
    log_uid, log_gid = (uid, gid) if mps.daemon_user == "any" else (daemon_user.uid,
                                                                     daemon_user.gid)
    return reset_mod.Target(
        DirTarget(inst.pipe_dir, mps.dir_mode, uid, gid, trusted, clear=True),
        DirTarget(inst.log_dir, mps.log_dir_mode, log_uid, log_gid, trusted, clear=False),
        owner, daemon_user)


def _show_state(obs: reset_mod.Observed, say: Say) -> None:
    if not obs.problems:
        say("  now: healthy (daemon, control and directories checks pass)")
    for r in obs.problems:
        say(f"  now: {STATE_NAMES[r.state]} {r.code}: {r.message}")
    c = obs.clients
    if c is not None:
        who = ", ".join(map(str, c.pids)) if c.pids else ("unknown" if not c.known else "none")
        say(f"  clients: {who} ({c.how})")


def control_binary(config: Config) -> str:
    """The control binary's path as the check finds it; Failure (CANNOT) up front when
    there is none, rather than make the dirs and fail to start a daemon."""
    found = locate(config)
    if found is None:
        raise Failure(f"cannot reset: {escape(not_found(config))}: MPS is not installed on "
                      "this node; install the NVIDIA driver's MPS binaries, or set "
                      "commands.nvidia-cuda-mps-control to the binary's path", ExitCode.CANNOT)
    broken = why_not_runnable(found)
    if broken is not None:  # no daemon of it can start: a reset would only stop the rest
        raise Failure(f"cannot reset: {escape(found)}: cannot run: {escape(broken[1])}; "
                      "reinstall the NVIDIA driver's MPS binaries first", ExitCode.CANNOT)
    return found


def reset(config: Config, root: str, wanted: Sequence[str], every: bool, force: bool,
          dry_run: bool, say: Say, automatic: bool = False) -> int:
    settings = remediation(config)
    ctx = Context(config, root)
    need_root(dry_run, "reset")
    control_binary(config)
    found = instances.gather(with_jobs(ctx))
    chosen = choose(ctx, wanted, every, found, " to reset")
    with lock_node(ctx, settings, "reset " + ",".join(i.name for i in chosen), dry_run):
        # Read once, before this call acts: the cooldown is per node, and the instances
        # one call resets ('--all') are one reset of the node, not a second one each.
        last = last_reset(ctx, found, say)
        return max(_reset_one(ctx, inst, settings, force, dry_run, say, automatic, last)
                   for inst in chosen)


def last_reset(ctx: Context, found: Sequence[Instance], say: Say) -> Tuple[float, str]:
    """When a reset last acted on any instance of this node (hostio/planned.py's records,
    which every reset writes before it acts) and which one ("instance NAME" among
    ``found``, else its pipe dir); (-inf, '') if never or unreadable (said)."""
    records, error = planned.load(ctx.config.state_dir)  # where the reset records it
    if error:
        say(f"note: the last reset's time is unknown ({error}): no cooldown applies")
    at, pipe_dir = planned.last_reset(records)
    if not pipe_dir:
        return at, ""
    names = [i.name for i in found if os.path.normpath(i.pipe_dir) == pipe_dir]
    return at, f"instance {names[0]}" if names else f"the instance on {escape(pipe_dir)}"


def _reset_one(ctx: Context, inst: Instance, settings: RemediationSettings, force: bool,
               dry_run: bool, say: Say, automatic: bool, last: Tuple[float, str]) -> int:
    target = target_for(ctx, inst, settings)
    say(f"reset {inst.name}: pipe dir {inst.pipe_dir}, log dir {inst.log_dir}")
    _unblock_first(ctx, inst, settings, dry_run, say)
    obs = reset_mod.observe(ctx, inst, uids=reset_mod.daemon_uids(ctx, target))
    _show_state(obs, say)
    plan = reset_mod.plan(ctx, obs, target, settings, force, last[0], automatic, last_of=last[1])
    for note in plan.notes:
        say(f"  note: {note}")
    audit = None if dry_run else audit_for(ctx, settings, "reset")
    problems = ",".join(r.code for r in obs.problems) or "none"
    if plan.nothing:
        say(f"  {plan.nothing}")
        if audit:
            audit.record("checked", "healthy", instance=inst.name)
        return DONE
    if plan.refused:
        # The commands it quotes act on what this reset looked at: its --config and --root.
        options = run_options(ctx.config.path, ctx.root)
        say(f"  refused: {with_options(Advice(plan.refused, plan.commands), options).text}")
        if audit:
            audit.record("refused", "cooldown" if plan.cooling else "refused",
                         instance=inst.name, problems=problems, why=plan.refused,
                         automatic=str(automatic).lower())
        return REFUSED
    say("  plan:")
    for number, step in enumerate(plan.steps, 1):
        say(f"  {number}. {step.text}")
    if dry_run or audit is None:
        say("  dry run: nothing was changed")
        return DONE

    started = time.monotonic()
    audit.record("begin", instance=inst.name, problems=problems, force=str(force).lower(),
                 automatic=str(automatic).lower(),
                 plan=" | ".join(s.text for s in plan.steps))
    say("  acting:")
    ok = reset_mod.execute(ctx, plan, obs, target, settings, say, audit)
    spent = time.monotonic() - started
    say(f"  result: {inst.name} is healthy again after {spent:.1f}s" if ok else
        f"  result: {inst.name} is NOT healthy after {spent:.1f}s; see the failed step "
        "above and the daemon's control.log")
    audit.record("finish", "ok" if ok else "failed", instance=inst.name, seconds=f"{spent:.2f}")
    return DONE if ok else FAILED


def _unblock_first(ctx: Context, inst: Instance, settings: RemediationSettings, dry_run: bool,
                   say: Say) -> None:
    """Free what holds the daemon before planning a restart: a wedge that freeing cures
    needs none, and a restart would end other users' servers (remediation/unblock.py)."""
    facts = unblock_mod.look(ctx.config, ctx.root, (inst,), ctx.config.budget_s)
    found = unblock_mod.plans(facts).get(inst.name, ())
    if not found:
        return
    say("  first, what holds its control daemon is freed (as 'mps-health remediate unblock' "
        "does):")
    for number, b in enumerate(found, 1):
        say(f"  {number}. {unblock_mod.step_text(b)}")
    if dry_run:
        say("  dry run: not freed; the reset below is planned as things are now")
        return
    audit = audit_for(ctx, settings, "unblock")
    unblock_mod.free(ctx, inst, found, say, audit, time.monotonic() + ctx.config.budget_s)


def unblock(config: Config, root: str, wanted: Sequence[str], dry_run: bool, say: Say) -> int:
    """``mps-health remediate unblock [INSTANCE...] [--dry-run]``: exit 0 freed or nothing
    held, 1 only a blocker of root's left, 2 acted but the daemon still does not answer."""
    settings = remediation(config)
    ctx = Context(config, root)
    need_root(dry_run, "unblock")
    chosen = choose(ctx, wanted, True, doing=" to unblock")
    with lock_node(ctx, settings, "unblock " + ",".join(i.name for i in chosen), dry_run):
        facts = unblock_mod.look(config, root, chosen, config.budget_s)
        todo = unblock_mod.plans(facts)
        audit = None if dry_run else audit_for(ctx, settings, "unblock")
        rc = DONE
        for inst in facts.instances:
            say(f"unblock {inst.name}: pipe dir {inst.pipe_dir}")
            found = todo.get(inst.name, ())
            why = unblock_mod.unanswered(facts, inst.name)
            if not found:
                say("  nothing holds its control daemon" + (
                    f" that mps-health can see (it gave no answer: {why})" if why else ""))
                continue
            say("  plan:")
            for number, b in enumerate(found, 1):
                say(f"  {number}. {unblock_mod.step_text(b)}")
            if dry_run:
                say("  dry run: nothing was changed")
                continue
            say("  acting:")
            freed = unblock_mod.free(ctx, inst, found, say, audit,
                                     time.monotonic() + config.budget_s)
            if freed.acted and not freed.answers:
                rc = max(rc, FAILED)
            elif freed.left:
                rc = max(rc, REFUSED)
        return rc
