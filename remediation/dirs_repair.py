"""``remediate dirs [INSTANCE...]``: put an instance's pipe and log dirs right and change
nothing else: no daemon quit, started or signalled, no client cut off.

The plan is ``dirs.plan_fix``'s; each dir is judged again under the node lock, a swap
only if still unused, then verified by the directories check, every step audited.
Exit 0 done or nothing to do, 1 a dir left to a reset (the rest done), 2 a step failed,
3 could not start.
"""

import time
from typing import List, Optional, Sequence, Tuple

from mps_health.checks.directories import judge_dir
from mps_health.config.load import Config
from mps_health.config.remediation import RemediationSettings, remediation
from mps_health.model.facts import Instance
from mps_health.model.results import OK, STATE_NAMES
from mps_health.probes.context import Context
from mps_health.probes.dirs import blocked_parents, read_dir
from mps_health.remediation import dirs
from mps_health.remediation import processes as procs
from mps_health.remediation.actions import (
    DONE,
    FAILED,
    REFUSED,
    Say,
    audit_for,
    choose,
    lock_node,
    need_root,
    target_for,
)
from mps_health.remediation.audit import Audit
from mps_health.remediation.reset import Target, os_error_text, plan_fixes


def in_use(ctx: Context, inst: Instance) -> str:
    """The control daemons and servers on the instance's pipe dir, named ("" if none)."""
    daemons, servers = procs.on_node(ctx, inst)
    return ", ".join(procs.describe(p) for p in (*daemons, *servers))


def plan(ctx: Context, inst: Instance, target: Target, busy: str
         ) -> Tuple[dirs.DirFix, dirs.DirFix]:
    return plan_fixes(read_dir(ctx.path(inst.pipe_dir), inst.pipe_dir, False),
                      read_dir(ctx.path(inst.log_dir), inst.log_dir, False), target, busy,
                      inst.name)


def verify(ctx: Context, inst: Instance, roles: Sequence[str]) -> List[str]:
    """What the directories check still finds wrong with these dirs (their entries are
    not this repair's business)."""
    paths = {"pipe": inst.pipe_dir, "log": inst.log_dir}
    return [f"{STATE_NAMES[r.state]} {r.code}: {r.message}" for role in roles
            for r in judge_dir(inst, role, read_dir(ctx.path(paths[role]), paths[role], False),
                               ctx.config) if r.state != OK]


def run(config: Config, root: str, names: Sequence[str], dry_run: bool, say: Say) -> int:
    settings = remediation(config)
    ctx = Context(config, root)
    need_root(dry_run, "dirs")
    chosen = choose(ctx, names)
    with lock_node(ctx, settings, "dirs " + ",".join(i.name for i in chosen), dry_run):
        audit = None if dry_run else audit_for(ctx, settings, "dirs")
        return max(_one(ctx, inst, settings, audit, say) for inst in chosen)


def _one(ctx: Context, inst: Instance, settings: RemediationSettings, audit: Optional[Audit],
         say: Say) -> int:
    target = target_for(ctx, inst, settings)
    say(f"dirs {inst.name}: pipe dir {inst.pipe_dir}, log dir {inst.log_dir}")
    busy = in_use(ctx, inst)
    say(f"  in use by: {busy or 'no daemon or server'}")
    fixes = plan(ctx, inst, target, busy)
    todo = [f for f in fixes if f.lines and not f.refused]
    refused = [("refused", f.target.path, f.refused) for f in fixes if f.refused]
    refusals = [("parent", path, why) for path, why in parents_left(ctx, inst)] + refused
    for result, path, why in refusals:
        say(f"  refused: {why}")
        if audit:
            audit.record("refused", result, instance=inst.name, dir=path, why=why)
    if not todo and not refusals:
        say(f"  {inst.name}'s pipe and log dirs are right: nothing to do")
        if audit:
            audit.record("checked", "healthy", instance=inst.name)
        return DONE
    if todo:
        say("  plan:")
        for number, f in enumerate(todo, 1):
            say(f"  {number}. {'; then '.join(f.lines)}")
    if audit is None:
        say("  dry run: nothing was changed")
        return REFUSED if refused or not todo else DONE
    if not todo:
        return REFUSED
    started = time.monotonic()
    audit.record("begin", instance=inst.name, busy=busy or "none",
                 plan=" | ".join("; ".join(f.lines) for f in todo))
    say("  acting:")
    failed = False
    for number, f in enumerate(todo, 1):
        ok, text = _act(ctx, inst, f)
        failed = failed or not ok
        say(f"  {number}. {'ok' if ok else 'FAILED'}: {text}")
        audit.record(f"step-{f.role}-dir", "ok" if ok else "failed", instance=inst.name,
                     detail=text)
    left = verify(ctx, inst, [f.role for f in todo])
    spent = time.monotonic() - started
    if left:
        failed = True
        say(f"  result: still wrong after {spent:.1f}s: {'; '.join(left)}")
    elif not failed:
        say(f"  result: {', '.join(f'{f.role} dir' for f in todo)} of {inst.name} right "
            f"after {spent:.1f}s; the daemon was not touched")
    audit.record("finish", "failed" if failed else "ok", instance=inst.name,
                 seconds=f"{spent:.2f}", left="; ".join(left))
    return FAILED if failed else (REFUSED if refusals else DONE)


def parents_left(ctx: Context, inst: Instance) -> List[Tuple[str, str]]:
    """(parent, why) for each parent of the instance's dirs others cannot traverse.
    mps-health makes the pipe and log dirs, never their parents (``safedirs.open_dir``
    only walks them; a package, a tmpfiles.d rule or a person made them), so it has no
    record that one is its own and changes none: a chmod of a dir it did not make could
    open what its owner meant to keep closed. The line says which chmod to run."""
    return [(p.path, f"{role} dir {path}: its parent {p.path} (mode {p.mode:04o}, uid {p.uid}) "
             "is not traversable by other users; mps-health did not make it and leaves it "
             f"alone: run 'chmod o+x {p.path}' if nothing needs it closed")
            for role, path in (("pipe", inst.pipe_dir), ("log", inst.log_dir))
            for p in blocked_parents(ctx, path)]


def _act(ctx: Context, inst: Instance, f: dirs.DirFix) -> Tuple[bool, str]:
    # Judged free under no lock a daemon start takes: look again just before a swap.
    if f.replace and (busy := in_use(ctx, inst)):
        return False, (f"{f.target.path}: now in use by {busy}: left as it is; run "
                       f"'mps-health remediate reset {inst.name}'")
    try:
        return True, "; ".join(dirs.repair(ctx.root, f.target, f.replace))
    except OSError as e:
        return False, os_error_text(e)
