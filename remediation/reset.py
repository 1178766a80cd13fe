"""reset: bring one MPS instance back the careful way, plan first.

1. Observe: the instance's processes (daemons only of the daemon user or root,
   ``processes.daemons_in``), its dirs by lstat, the daemon's answer, the core checks'
   verdict, and the connected clients.
2. Plan: nothing for a healthy instance (unless forced); only dir faults the daemon
   keeps running through (``in_place``) are put right in place, with no restart, so
   clients are no reason to refuse; refused while clients are connected or cannot be
   ruled out, or within the cooldown (unless forced); otherwise the steps below.
3. Act, each step re-checking what it acts on: ``quit -t N``; end what is left by
   verified PID; move aside a symlinked or foreign pipe/log dir, clear stale entries,
   set mode and owner; make control.log and server.log the daemon user's regular files
   (``safedirs.keep_files``: so the daemon never appends where a user chose); start the
   daemon as the configured user with the instance's environment; verify.
"""

import os
import time
from typing import Callable, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from mps_health.checks import directories
from mps_health.config.remediation import RemediationSettings
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.engine.actionhints import Advice, advice, quoted
from mps_health.hostio.planned import RESET_BEGIN
from mps_health.hostio.planned import record as record_planned
from mps_health.hostio.runner import SAFE_PATH, RunAs
from mps_health.hostio.safedirs import UnsafePath, keep_files
from mps_health.hostio.safefiles import read_tail
from mps_health.hostio.users import ROOT, User, groups_of
from mps_health.model.facts import ControlAnswer, DirFact, Facts, Instance, ProcessFact
from mps_health.model.facts_deep import LOG_FILES
from mps_health.model.printable import escape
from mps_health.model.results import CRITICAL, UNKNOWN, Command, Result, is_problem
from mps_health.probes import control as control_probe
from mps_health.probes.context import Context, node_name
from mps_health.probes.dirs import read_dir
from mps_health.probes.proc import binaries_here, read_processes, with_named
from mps_health.probes.process_identity import CONTROL, locate
from mps_health.remediation import clients as clients_mod
from mps_health.remediation import dirs
from mps_health.remediation import processes as procs
from mps_health.remediation.audit import Audit
from mps_health.remediation.daemonctl import quit_daemon, start_daemon

CORE_CHECKS = ("daemon", "control", "directories")


class Observed(NamedTuple):
    inst: Instance
    daemons: Tuple[ProcessFact, ...]
    servers: Tuple[ProcessFact, ...]
    pipe: DirFact
    log: DirFact
    answer: ControlAnswer
    results: Tuple[Result, ...]  # the core checks' results for this instance
    clients: Optional[clients_mod.Clients]

    @property
    def problems(self) -> Tuple[Result, ...]:
        return tuple(r for r in self.results if is_problem(r))


class Target(NamedTuple):
    """What the instance should look like after the reset."""

    pipe: dirs.DirTarget
    log: dirs.DirTarget
    dir_owner: User
    daemon_user: User


def log_owner(target: Target) -> User:
    """Who the log dir is made for: the daemon's user, or the dirs' owner when any user
    may run the daemon."""
    return target.daemon_user if target.log.uid == target.daemon_user.uid else target.dir_owner


class Step(NamedTuple):
    # "quit" | "end" | "pipe-dir" | "log-dir" | "start" | "verify"; "pipe-dir-fix" and
    # "log-dir-fix" for a repair in place around a running daemon (no restart)
    kind: str
    text: str


# The steps of a restart (a plan of only "-fix" steps and "verify" keeps the daemon).
RESTART_STEPS = frozenset({"quit", "end", "pipe-dir", "log-dir", "start"})


class Plan(NamedTuple):
    inst: Instance
    steps: Tuple[Step, ...]
    refused: str = ""  # why nothing will be done without --force ("" if not refused)
    nothing: str = ""  # why nothing needs doing ("" if something does)
    notes: Tuple[str, ...] = ()
    cooling: bool = False  # refused by the cooldown (remediation.cooldown_s)
    commands: Tuple[Command, ...] = ()  # the mps-health commands ``refused`` quotes, as argv


def judge(ctx: Context, inst: Instance, found: Tuple[ProcessFact, ...],
          dir_facts: Dict[str, DirFact], answer: ControlAnswer) -> Tuple[Result, ...]:
    """The core checks (daemon, control, directories) on this instance alone."""
    facts = Facts(node_name(ctx.config), time.time(), ctx.root, (inst,),
                  {"processes": found, "dirs": dir_facts, "control": {inst.name: answer}}, {}, {})
    table = registry.checks()
    runs = engine.judge(facts, ctx.config, [table[n] for n in CORE_CHECKS if n in table])
    return tuple(r for run_ in runs for r in run_.results if r.instance == inst.name)


def daemon_uids(ctx: Context, target: Target) -> Optional[FrozenSet[int]]:
    """The uids whose daemon on the pipe dir a reset may quit and end (None: any): the
    daemon's user, and root (replaced after ``mps.daemon_user`` changes). Any other uid's
    is a stray (``daemon-foreign``), never signalled, whatever the pid file names."""
    return None if ctx.config.mps.daemon_user == "any" else frozenset({0, target.daemon_user.uid})


def observe(ctx: Context, inst: Instance, with_clients: bool = True,
            uids: Optional[FrozenSet[int]] = None) -> Observed:
    found = read_processes(ctx.proc, binaries_here(ctx))
    pipe = read_dir(ctx.path(inst.pipe_dir), inst.pipe_dir, True)
    # A daemon started between the scan and the pid file's read is no stale one.
    found = with_named(ctx, found, {inst.pipe_dir: pipe})
    daemons, servers = procs.of_instance(inst, found, ctx.root, uids)
    log = read_dir(ctx.path(inst.log_dir), inst.log_dir, False)
    # Asked even when the daemon is stopped: the answer (a timeout) is bounded and honest.
    answer = clients_mod.ask(ctx, inst, control_probe.QUERY, ctx.config.control.timeout_s)
    results = judge(ctx, inst, found, {inst.pipe_dir: pipe, inst.log_dir: log}, answer)
    who = clients_mod.find(ctx, inst, servers, answer.status == "ok",
                           ctx.config.control.timeout_s) if with_clients else None
    return Observed(inst, daemons, servers, pipe, log, answer, results, who)


def daemon_env(ctx: Context, inst: Instance, user: User,
               settings: RemediationSettings) -> Dict[str, str]:
    """A small, explicit environment: never the caller's whole one (SUDO_*, secrets)."""
    # A fixed PATH and locale: the daemon finds nvidia-cuda-mps-server through PATH, and
    # a caller's PATH (a user's bin first, a conda env) must not decide which one runs.
    env = {"PATH": SAFE_PATH, "HOME": user.home, "USER": user.name, "LOGNAME": user.name,
           "LANG": "C.UTF-8", "CUDA_MPS_PIPE_DIRECTORY": ctx.path(inst.pipe_dir),
           "CUDA_MPS_LOG_DIRECTORY": ctx.path(inst.log_dir)}
    if inst.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = inst.gpu
    env.update(dict(settings.daemon_env))
    return env


def cooldown(last: float, now: float, settings: RemediationSettings, force: bool,
             automatic: bool, which: str = "", logs: str = "") -> Tuple[str, str]:
    """(refusal, note) of the cooldown (pure): a restart within ``remediation.cooldown_s``
    of the node's last reset (``last``, of ``which``: "instance gpu0"), of any instance,
    is refused; a manual one goes with --force, an automatic one never does. ``logs``:
    where to read why (``logs_to_read``)."""
    if settings.cooldown_s <= 0 or not now - last < settings.cooldown_s:
        return "", ""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(last))
    said = (f"cooldown: the last reset on this node was at {when}, of {which or 'an instance'} "
            f"({max(0.0, now - last):.0f}s ago, remediation.cooldown_s is {settings.cooldown_s:g})")
    read = f"read {logs}" if logs else "look at the daemon's control.log and the audit log"
    if automatic:
        return f"{said}; an automatic reset never resets the node again within that time: " \
            f"{read}", ""
    if force:
        return "", f"{said}: restarting anyway (--force)"
    return f"{said}; a restart that did not cure it will not now: {read}, or use --force", ""


def logs_to_read(ctx: Context, inst: Instance, settings: RemediationSettings) -> str:
    """Where a refused reset's reader finds why the last one did not cure: the daemon's
    control.log and the audit log (its 'begin' and 'finish' lines of that reset)."""
    return (f"{os.path.join(ctx.path(inst.log_dir), 'control.log')} (what the daemon said) "
            f"and the audit log {ctx.path(settings.audit_log)} (what the last reset did)")


def clients_refusal(inst: Instance, listed: str, how: str) -> Advice:
    """Why a reset with clients connected is refused, and what to run instead: let the
    work end (drained, so that no new job starts here), then reset."""
    see = advice(("mps-health", "clients", inst.name), " lists them")
    if inst.job_id is not None:  # the job's own clients: they end with it, and so does the instance
        wait = advice(f"wait until job {inst.job_id}'s clients end (", see, "; its Epilog "
                      "removes the instance when the job ends)")
    else:
        wait = advice("drain the node so that no new job starts here (",
                      ("mps-health", "remediate", "drain", "--reason", f"reset-{inst.name}"),
                      "), wait until these clients end (", see, "), then run this reset again "
                      "and ", ("mps-health", "remediate", "resume"))
    return advice(f"{listed} ({how}); a reset would break them: ", wait, "; or use --force "
                  "(they lose their MPS server)")


def plan(ctx: Context, obs: Observed, target: Target, settings: RemediationSettings,
         force: bool, last: float = float("-inf"), automatic: bool = False,
         now: Optional[float] = None, last_of: str = "") -> Plan:
    """The steps to take, or why none will be taken (pure over the observations, the time
    of the node's last reset ``last``, of instance ``last_of``, and ``now``)."""
    inst = obs.inst
    named = obs.pipe.pid_file
    ignored = procs.pid_file_ignored(int(named) if named and named.isdigit() else None,
                                     obs.daemons, daemon_uids(ctx, target))
    notes: List[str] = [ignored] if ignored else []
    if not obs.problems and not force:
        return Plan(inst, (), nothing=f"{inst.name} is healthy: nothing to do "
                    "(--force restarts it anyway)", notes=tuple(notes))
    fixes = None if force else in_place(obs, target)
    if fixes is not None:
        # Nothing a restart would mend: the dirs are put right around the running daemon,
        # as 'remediate dirs' does, so its clients are neither refused for nor cut off.
        notes.append(f"only dir faults the daemon keeps running through: fixed in place, "
                     f"as 'mps-health remediate dirs {inst.name}' does, no restart "
                     "(--force restarts it too)")
        fixed = [Step(f"{f.role}-dir-fix", "; then ".join(f.lines)) for f in fixes if f.lines]
        return Plan(inst, (*fixed, _verify_step(settings)), notes=tuple(notes))
    refused, note = cooldown(last, time.time() if now is None else now, settings, force,
                             automatic, last_of, logs_to_read(ctx, inst, settings))
    if refused:
        return Plan(inst, (), refused=refused, notes=tuple(notes), cooling=True)
    if note:
        notes.append(note)
    who = obs.clients
    if who is not None and not force:
        if not who.known:
            look = ("mps-health", "clients", inst.name)
            return Plan(inst, (), refused=f"{who.how}; refusing without --force "
                        f"({quoted(look)} shows who is connected)", notes=tuple(notes),
                        commands=(look,))
        if who.pids:
            listed = clients_mod.describe(ctx.proc, who.pids)
            why = clients_refusal(inst, f"{len(who.pids)} client(s) connected: {listed}",
                                  who.how)
            return Plan(inst, (), refused=why.text, notes=tuple(notes), commands=why.commands)
    steps: List[Step] = []
    running = [d for d in obs.daemons if d.state not in ("T", "t")]
    if running and obs.answer.status == "ok":
        n = settings.quit_timeout_s
        steps.append(Step("quit", f"ask control daemon {', '.join(str(d.pid) for d in running)} "
                          f"to quit ('quit -t {max(1, round(n))}': servers still busy after "
                          f"that are killed), waiting at most {n + 5:g}s"))
    listed = ", ".join(procs.describe(p) for p in (*obs.daemons, *obs.servers))
    steps.append(Step("end", f"end what is left of {listed}: each PID checked in /proc "
                      f"first, SIGTERM, SIGKILL after {settings.term_timeout_s:g}s" if listed
                      else "end any daemon or server of this instance found by then (none now)"))
    pipe_lines = dirs.describe(obs.pipe, target.pipe, target.dir_owner.name)
    steps.append(Step("pipe-dir", "; then ".join(pipe_lines) or
                      f"check {inst.pipe_dir} again (it looks right now)"))
    log_lines = dirs.describe(obs.log, target.log, log_owner(target).name)
    if log_lines:
        steps.append(Step("log-dir", "; then ".join(log_lines)))
    env = daemon_env(ctx, inst, target.daemon_user, settings)
    shown = " ".join(f"{k}={v}" for k, v in env.items() if k.startswith("CUDA_"))
    user = target.daemon_user
    steps.append(Step("start", f"make sure {inst.log_dir}'s control.log and server.log are "
                      f"regular files of {user.name} (a link is removed, anything else moved "
                      f"aside), then start '{control_path(ctx)} -d' as {user.name} (uid "
                      f"{user.uid}) with {shown}"))
    steps.append(_verify_step(settings))
    return Plan(inst, tuple(steps), notes=tuple(notes))


def _verify_step(settings: RemediationSettings) -> Step:
    return Step("verify", f"verify: the daemon answers within {settings.verify_timeout_s:g}s "
                "and the daemon, control and directories checks pass")


# The directories check's faults of a dir itself (not of its entries, not an lstat the
# check could not make): the ones 'remediate dirs' may put right without a restart.
DIR_CODES = frozenset(c for c in directories.CODES if "-dir-" in c and
                      not c.endswith(("-unreadable", "-parent")))


def in_place(obs: Observed, target: Target) -> Optional[Tuple[dirs.DirFix, ...]]:
    """The dir repairs that are all this instance needs (pure), each fixable with the
    daemon running; None when anything else is wrong or a dir must be swapped: restart."""
    if not obs.problems or any(r.check != directories.NAME or r.code not in DIR_CODES
                               for r in obs.problems):
        return None
    fixes = plan_fixes(obs.pipe, obs.log, target, "its daemon", obs.inst.name)
    return None if any(f.refused for f in fixes) else fixes


def plan_fixes(pipe: DirFact, log: DirFact, target: Target, busy: str, name: str
               ) -> Tuple[dirs.DirFix, dirs.DirFix]:
    """``dirs.plan_fix`` for the instance's pipe and log dirs (``remediate dirs``, reset)."""
    return (dirs.plan_fix("pipe", pipe, target.pipe, target.dir_owner.name, busy, name),
            dirs.plan_fix("log", log, target.log, log_owner(target).name, busy, name))


def os_error_text(e: OSError) -> str:
    if isinstance(e, UnsafePath) or not e.filename:
        return e.strerror or str(e)
    return f"{e.filename}: {e.strerror}"


class Outcome(NamedTuple):
    ok: bool
    text: str
    stop: bool = False  # do not go on with later steps


Say = Callable[[str], None]


def control_path(ctx: Context) -> str:
    """The control binary the check judged by; its configured name where there is none
    (a reset refuses up front then, actions.control_binary)."""
    return locate(ctx.config) or ctx.config.command(CONTROL)


def _do_end(ctx: Context, inst: Instance, planned: Tuple[ProcessFact, ...],
            settings: RemediationSettings, uids: Optional[FrozenSet[int]]) -> Outcome:
    daemons, servers = procs.on_node(ctx, inst, uids)
    # What we planned on, plus any process of this instance started since (same pipe dir).
    seen = {(q.pid, q.start_ticks) for q in planned}
    todo = [*planned, *(p for p in (*daemons, *servers) if (p.pid, p.start_ticks) not in seen)]
    if not todo:
        return Outcome(True, "no daemon or server of this instance is left")
    ended = procs.end_all(ctx.proc, todo, settings.term_timeout_s)
    text = "; ".join(f"{e.pid}: {e.detail}" for e in ended)
    if any(e.outcome == "alive" for e in ended):
        return Outcome(False, text + " - not touching its pipe dir while it lives", stop=True)
    return Outcome(True, text)


def _do_start(ctx: Context, inst: Instance, target: Target,
              settings: RemediationSettings) -> Outcome:
    user = target.daemon_user
    kept = "".join(line + "; " for line in keep_files(inst.log_dir, (user.uid,), LOG_FILES,
                                                      ctx.root))
    env = daemon_env(ctx, inst, user, settings)
    as_user = RunAs(user.uid, user.gid, groups_of(user), "/") if user.uid != os.geteuid() \
        else None
    started = start_daemon(control_path(ctx), ctx.path(inst.pipe_dir), as_user, env,
                           max(10.0, settings.verify_timeout_s), ctx.proc)
    if started.pid is None:
        return Outcome(False, f"{kept}{started.detail}; "
                       f"{daemon_logged(ctx.path(inst.log_dir), user.uid)}", stop=True)
    # A planned restart: the servers check must not report it as daemon-restarted.
    unrecorded = record_planned(ctx.config.state_dir, inst.pipe_dir, "reset", started.pid,
                                started.start_ticks)
    return Outcome(True, f"{kept}started as {user.name}: daemon {started.pid} answers "
                   f"({started.elapsed_s:.2f}s)" + (f"; {unrecorded}" if unrecorded else ""))


def daemon_logged(log_dir: str, uid: Optional[int], lines: int = 3) -> str:
    """What the daemon (of ``uid``) last wrote in control.log, quoted and escaped, for a
    failure line; a file of another owner is not quoted."""
    path = os.path.join(log_dir, "control.log")
    try:
        data = read_tail(path, 2048, uid)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if not data:
        return f"{path} is {'missing' if data is None else 'empty'}"
    last = data.decode("utf-8", "replace").splitlines()[-lines:]
    return f"{path} ends: " + " | ".join(escape(ln.strip())[:200] for ln in last)


def _do_verify(ctx: Context, inst: Instance, target: Target, settings: RemediationSettings,
               uids: Optional[FrozenSet[int]]) -> Outcome:
    deadline, answer = time.monotonic() + settings.verify_timeout_s, None
    while time.monotonic() < deadline:
        answer = clients_mod.ask(ctx, inst, control_probe.QUERY,
                                 min(ctx.config.control.timeout_s, settings.verify_timeout_s))
        if answer.status == "ok":
            break
        time.sleep(0.1)
    obs = observe(ctx, inst, with_clients=False, uids=uids)
    bad = obs.problems
    if answer is None or answer.status != "ok":
        why = answer.detail if answer is not None else "not asked"
        return Outcome(False, f"the daemon did not answer within "
                       f"{settings.verify_timeout_s:g}s ({why}); "
                       + daemon_logged(ctx.path(inst.log_dir), target.daemon_user.uid))
    worst = [r for r in bad if r.state in (CRITICAL, UNKNOWN)]
    if worst:
        return Outcome(False, "; ".join(f"{r.code}: {r.message}" for r in worst))
    extra = (" (still: " + "; ".join(f"{r.code}: {r.message}" for r in bad) + ")") if bad else ""
    return Outcome(True, f"answered in {answer.latency_s * 1000:.0f} ms; checks pass{extra}")


def execute(ctx: Context, p: Plan, obs: Observed, target: Target,
            settings: RemediationSettings, say: Say, audit: Audit) -> bool:
    """Run the plan's steps in order; True when the instance verified healthy."""
    inst, planned, verified = p.inst, (*obs.daemons, *obs.servers), False
    if any(s.kind in RESTART_STEPS for s in p.steps):
        # Before the first quit, so a run while we act takes what goes for ours: the
        # daemon's change, the servers it ends (hostio/planned.py); and the reset cooldown
        # counts from it. A repair in place ends nothing and restarts nothing: no record.
        unrecorded = record_planned(ctx.config.state_dir, inst.pipe_dir, RESET_BEGIN)
        if unrecorded:
            say(f"  {unrecorded}")
    for number, step in enumerate(p.steps, 1):
        try:
            if step.kind == "quit":
                n, env = settings.quit_timeout_s, daemon_env(ctx, inst, ROOT, settings)
                problem = quit_daemon(control_path(ctx), None, env, n, n + 5.0)
                out = Outcome(True, f"{problem}: ending it by PID instead" if problem
                              else "the daemon accepted 'quit'")
            elif step.kind == "end":
                out = _do_end(ctx, inst, planned, settings, daemon_uids(ctx, target))
            elif step.kind.startswith(("pipe-dir", "log-dir")):
                dt = target.pipe if step.kind.startswith("pipe") else target.log
                # A "-fix" is in place only: the daemon's entries kept, nothing swapped.
                fix = step.kind.endswith("-fix")
                out = Outcome(True, "; ".join(dirs.repair(
                    ctx.root, dt._replace(clear=False) if fix else dt, replace=not fix)))
            elif step.kind == "start":
                out = _do_start(ctx, inst, target, settings)
            else:
                out = _do_verify(ctx, inst, target, settings, daemon_uids(ctx, target))
                verified = out.ok
        except OSError as e:
            out = Outcome(False, os_error_text(e), stop=True)
        say(f"  {number}. {'ok' if out.ok else 'FAILED'}: {out.text}")
        audit.record(f"step-{step.kind}", "ok" if out.ok else "failed", instance=inst.name,
                     detail=out.text)
        if not out.ok and (out.stop or step.kind.startswith(("pipe-dir", "log-dir"))):
            return False
    return verified
