"""Run the CUDA canary through each instance and see whether MPS really served it.

Skipped while another user's clients are connected (MPS serves one user per GPU at a
time: it would queue behind that job). Else ``canary_client.py`` (or
``commands.mps-health-canary``) runs as the daemon's user, in its own process group, with a
hard timeout; holding a context, it writes a ready file, and its PID in a server's client
list means MPS served it. Removing the file lets it exit. ``canary.when: idle`` (default)
runs it only on a node Slurm says is IDLE with no MPS client, and kills it once a root
``slurmstepd`` (a job step) appears (docs/runbook-deep.md).
"""

import contextlib
import os
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from mps_health.config.deep_checks import CANARY, CanaryConfig
from mps_health.config.load import Config
from mps_health.hostio.runner import Completed, Pending
from mps_health.hostio.safefiles import read_small
from mps_health.hostio.users import by_uid, name_of, uid_of
from mps_health.model.facts import Instance
from mps_health.model.facts_deep import CanaryFact
from mps_health.probes import control
from mps_health.probes.context import Context
from mps_health.probes.proc import identity
from mps_health.probes.server_queries import parse_pid_list

if TYPE_CHECKING:
    from mps_health.model.slurm_facts import SlurmNode

TAG = "mps-health-canary"
COMMAND = "mps-health-canary"  # commands.mps-health-canary overrides the built-in client


# --- parse (pure) ---------------------------------------------------------------------

def parse_verdict(stdout: str) -> Tuple[str, Dict[str, str], str]:
    """The canary's last ``mps-health-canary`` line -> (kind, key=value fields, rest)."""
    for raw in reversed(stdout.strip().splitlines()):
        words = raw.split()
        if len(words) >= 2 and words[0] == TAG:
            fields = {}
            for w in words[2:]:
                key, sep, value = w.partition("=")
                if sep and key.isidentifier():
                    fields[key] = value
            if words[1] == "cuda-error":  # name=... may hold spaces: take the rest
                at = raw.find(" name=")
                if at >= 0:
                    fields["name"] = raw[at + 6:].strip()
            return words[1], fields, raw.split(None, 2)[2] if len(words) > 2 else ""
    raise ValueError("no verdict line")


def judge_run(done: Completed, ready: Optional[Tuple[int, float]], served_by: int,
              uid: int, timeout_s: float) -> CanaryFact:
    """One finished canary run as a fact (pure: tested on the canary's own output)."""
    if done.exec_error is not None:
        return CanaryFact("error", f"cannot run the canary: {done.exec_error}", uid)
    pid, context_s = ready if ready is not None else (0, None)
    if done.timed_out:
        why = ("it held a context but did not exit" if ready is not None else
               "no CUDA context: clients of this pipe dir hang")
        return CanaryFact("timeout", f"no result within {timeout_s:g}s ({why})", uid, pid,
                          context_s, done.elapsed_s, served_by)
    try:
        kind, fields, rest = parse_verdict(done.stdout)
    except ValueError:
        said = (done.stdout.strip() or done.stderr.strip() or "nothing").splitlines()[-1]
        return CanaryFact("error", f"the canary exited with status {done.rc} and said: "
                          f"{said[:200]}", uid, pid, context_s, done.elapsed_s)
    if kind == "no-libcuda":
        return CanaryFact("no-libcuda", rest, uid, total_s=done.elapsed_s)
    if kind == "cuda-error":
        step, code, name = (fields.get(k, "?") for k in ("step", "code", "name"))
        return CanaryFact("failed", f"{step} failed: {name} ({code})", uid, pid, context_s,
                          done.elapsed_s, served_by, f"{name} ({code}) at {step}")
    if kind == "ok" and ready is not None:
        latency = float(fields.get("context_s", context_s or 0.0))
        if served_by:
            return CanaryFact("served", f"served by MPS server {served_by}", uid, pid, latency,
                              done.elapsed_s, served_by)
        return CanaryFact("not-served", "it got a CUDA context but no MPS server listed it",
                          uid, pid, latency, done.elapsed_s)
    return CanaryFact("error", f"unexpected verdict: {kind} {rest}".strip(), uid, pid,
                      context_s, done.elapsed_s)


# --- read (I/O) -----------------------------------------------------------------------

def canary_user(ctx: Context, inst: Instance, cfg: CanaryConfig) -> Optional[int]:
    """The configured user, else the live daemon's, else what the config expects."""
    if cfg.user:
        return uid_of(cfg.user)
    from mps_health.probes.servers import read_daemon

    daemon_pid, _start, _busy = read_daemon(ctx, inst)
    ident = identity(ctx.proc, daemon_pid) if daemon_pid is not None else None
    if ident is not None:
        return ident[0]
    from mps_health.probes.instances import expected_uid

    want = expected_uid(ctx.config.mps.daemon_user, None)
    return os.geteuid() if want is None else want


def clients(ctx: Context, inst: Instance, deadline: float
            ) -> Tuple[str, str, List[Tuple[int, int, Optional[int]]]]:
    """(control status, detail, [(server, client pid, client uid)]) under the pipe lock;
    "unanswered" (and why): the daemon gave the run's query no answer (the canary still
    runs: it shows whether CUDA clients hang)."""
    if ctx.queries is not None:
        why = ctx.queries.unanswered(inst.pipe_dir, deadline)
        if why:
            return "unanswered", why, []
    lock = control.pipe_lock(ctx, inst)
    if not lock.acquire(min(deadline, time.monotonic() + ctx.config.control.timeout_s)):
        return "skipped", "another mps-health query to this pipe dir did not finish", []
    try:
        listing = control.ask(ctx, inst, "get_server_list", deadline)
        if listing.status != "ok":
            return listing.status, listing.detail, []
        found = []
        for server in parse_pid_list(listing.stdout):
            answer = control.ask(ctx, inst, f"get_client_list {server}", deadline)
            if answer.status != "ok" or answer.stdout.strip().endswith("not found"):
                continue
            for pid in parse_pid_list(answer.stdout):
                ident = identity(ctx.proc, pid)
                found.append((server, pid, ident[0] if ident else None))
        return "ok", "", found
    except ValueError as e:
        return "error", str(e), []
    finally:
        lock.release()


def _argv(config: Config) -> List[str]:
    if COMMAND in config.commands:
        return [config.commands[COMMAND]]
    from mps_health.probes import canary_client

    return [sys.executable, "-I", "-S", os.path.abspath(canary_client.__file__)]


def _private_dir(ctx: Context, uid: int) -> str:
    base = ctx.config.run_dir
    try:
        os.makedirs(base, mode=0o755, exist_ok=True)
    except OSError:
        base = tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix="canary-", dir=base)
    if uid != os.geteuid():
        os.chown(path, uid, -1)  # the canary writes its ready file here
    return path


def _remove(directory: str) -> None:
    for name in ("ready", "ready.tmp"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)


# --- the idle gate (canary.when: idle) ------------------------------------------------

def node_busy(ctx: Context) -> str:
    """Why the node is not idle for the canary ('' when Slurm says IDLE), by one bounded
    ``scontrol show node`` (the slurm source's own, where the run reads one); not run where
    Slurm is absent (canary.when: always runs it)."""
    from mps_health.config.slurm import settings as slurm_settings
    from mps_health.probes.context import node_name
    from mps_health.probes.slurm import SlurmError, node_facts, read_node

    name = node_name(ctx.config, ctx.env)
    if ctx.slurm_node is not None:  # the run's one node read serves the gate too
        facts = node_facts(ctx)
        if facts is None:
            return "Slurm cannot say whether this node is idle (scontrol show node did not " \
                   "finish within the run's budget)"
        if facts.node is None:
            return _not_known(facts.error_code or "error", facts.error or "no answer")
        return idle_reason(name, facts.node)
    timeout_s = max(0.1, min(slurm_settings(ctx.config).timeout_s, ctx.remaining()))
    try:
        return idle_reason(name, read_node(ctx.config, name, timeout_s))
    except SlurmError as e:
        return _not_known(e.code, str(e))


def _not_known(code: str, line: str) -> str:
    """Why Slurm's answer cannot tell whether the node is idle (code: classify_failure's)."""
    if code in ("exec-failed", "node-unknown"):
        return (f"this node is not managed by Slurm ({line}); canary.when: always runs "
                "it anyway")
    return f"Slurm cannot say whether this node is idle ({line})"


def idle_reason(name: str, node: "SlurmNode") -> str:
    """'' when Slurm says the node is IDLE with nothing finishing or powering; else why not."""
    flags = set(node.flags)
    if node.flags[:1] != ("IDLE",) or flags & {"COMPLETING", "POWERING_UP", "POWERED_DOWN"}:
        return f"Slurm says node {name} is {node.state}, not IDLE (canary.when: idle)"
    return ""


def job_steps(proc: str) -> frozenset:
    """The PIDs of root's ``slurmstepd`` processes (one per job step: a new one is a job
    arriving). By /proc/PID's owner and comm: a user's process so named counts for nothing."""
    try:
        names = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return frozenset()
    found = set()
    for name in names:
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.stat(f"{proc}/{name}").st_uid == 0 \
                    and (read_small(f"{proc}/{name}/comm", 64) or b"").strip() == b"slurmstepd":
                found.add(int(name))
    return frozenset(found)


class Watch:
    """canary.when: idle: every ``poll_s``, a new root ``slurmstepd`` (a job step arriving)?
    Sooner than slurmctld, and no query of a daemon a job's client may be waiting on."""

    def __init__(self, proc: str, poll_s: float) -> None:
        self.proc, self.poll_s = proc, poll_s
        self.before = job_steps(proc)
        self.next = time.monotonic() + poll_s
        self.arrived: frozenset = frozenset()

    def job_arrived(self) -> bool:
        if time.monotonic() < self.next:
            return False
        self.next = time.monotonic() + self.poll_s
        self.arrived = job_steps(self.proc) - self.before
        return bool(self.arrived)


def run_one(ctx: Context, inst: Instance, cfg: CanaryConfig) -> CanaryFact:
    uid = canary_user(ctx, inst, cfg)
    if uid is None:
        return CanaryFact("error", f"user {cfg.user!r} does not exist (canary.user)", -1)
    deadline = min(time.monotonic() + cfg.timeout_s, ctx.deadline)
    watch = Watch(ctx.proc, cfg.poll_s) if cfg.when == "idle" else None
    status, detail, before = clients(ctx, inst, deadline)
    if status == "skipped":
        return CanaryFact("not-run", detail, uid)
    if watch is not None and before:
        server, pid, who = before[0]
        return CanaryFact("skipped", f"{len(before)} MPS client(s) connected (e.g. {pid}, "
                          f"uid {who if who is not None else '?'}, on server {server}): the "
                          "node is not idle (canary.when: idle)", uid)
    # A daemon that does not answer is tried anyway: do CUDA clients hang on it?
    others = [(s, p, u) for s, p, u in before if u is not None and u != uid]
    if others:
        server, pid, other = others[0]
        return CanaryFact("skipped", f"{len(others)} client(s) of another user are connected "
                          f"(e.g. {pid}, {name_of(other) or other}, on server {server}): "
                          "the canary would queue behind them", uid)
    workdir = _private_dir(ctx, uid)
    ready_path = os.path.join(workdir, "ready")
    env = control.client_env(ctx, inst)
    env.update(MPS_HEALTH_CANARY_READY=ready_path, MPS_HEALTH_CANARY_HOLD_S=str(cfg.timeout_s),
               MPS_HEALTH_CANARY_DEVICE=str(cfg.device),
               MPS_HEALTH_CANARY_BYTES=str(cfg.alloc_bytes))
    switch = uid != os.geteuid()
    try:
        pending = Pending(_argv(ctx.config), None, env, uid if switch else None,
                          by_uid(uid).gid if switch else None)
        ready: Optional[Tuple[int, float]] = None
        while pending.pid is not None and time.monotonic() < deadline:
            if watch is not None and watch.job_arrived():
                pending.kill()
                pending.wait(deadline)
                return CanaryFact("skipped", "stopped: a job step started on this node while "
                                  f"it ran (slurmstepd {min(watch.arrived)}); the canary was "
                                  "killed so the job's clients do not wait behind it", uid)
            if os.path.exists(ready_path):
                try:  # "PID SECONDS", left by the user's canary: read as hostile
                    who_pid, at = (read_small(ready_path, 4096) or b"").decode("ascii").split()
                    ready = (int(who_pid), float(at))
                except (OSError, ValueError):
                    ready = (pending.pid or 0, 0.0)
                break
            if pending.finished():
                break
            time.sleep(0.005)
        served_by = 0
        if ready is not None:
            _status, _detail, during = clients(ctx, inst, deadline)
            served_by = next((s for s, p, _u in during if p == ready[0]), 0)
            with contextlib.suppress(OSError):
                os.unlink(ready_path)  # the go: free, destroy, exit
        done = pending.wait(deadline)
    finally:
        _remove(workdir)
    fact = judge_run(done, ready, served_by, uid, cfg.timeout_s)
    extra = {"timeout": "the control daemon did not answer get_server_list either",
             "unanswered": detail}.get(status)
    return fact._replace(detail=f"{fact.detail}; {extra}") if extra else fact


def gather(ctx: Context, instances: Tuple[Instance, ...]) -> Dict[str, CanaryFact]:
    cfg: CanaryConfig = ctx.config.get(CANARY)
    facts: Dict[str, CanaryFact] = {}
    why = "canary.when is never" if cfg.when == "never" else \
        node_busy(ctx) if cfg.when == "idle" and instances else ""
    if why or not instances:
        return {i.name: CanaryFact("skipped", why, -1) for i in instances}

    def one(inst: Instance) -> None:
        try:
            facts[inst.name] = run_one(ctx, inst, cfg)
        except OSError as e:
            facts[inst.name] = CanaryFact("error", f"cannot run the canary: {e}", -1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ctx.remaining())
    return facts


VALUE_TYPE = Dict[str, CanaryFact]
