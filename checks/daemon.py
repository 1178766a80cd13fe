"""daemon: a live (not zombie) nvidia-cuda-mps-control serves each instance.

The control socket and the pid file both survive a SIGKILL, so liveness comes from the
process table (``common.live_daemons``). ``daemon_up`` (the fleet alert counts its 0s) is
1 only for a daemon that can serve: 0 when none runs, it is stopped (every client hangs)
or this run's control query got no answer (wedged), so a fleet-wide wedge counts too.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Tuple

from mps_health.checks.common import live_daemons, reset_action
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import advice
from mps_health.model.facts import DirFact, Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, OK, WARNING, Result
from mps_health.probes.instances import expected_uid

NAME = "daemon"
CODES = ("daemon-absent", "daemon-duplicate", "daemon-root", "daemon-stale", "daemon-stopped",
         "daemon-uninterruptible", "daemon-foreign", "instances-capped", "mps-not-installed")

registry.check(NAME, f"{__name__}:check", ("processes", "dirs"), order=10,
               summary="a live control daemon serves each instance")


def _judge_instance(inst: Instance, procs: Tuple[ProcessFact, ...], pipe: Optional[DirFact],
                    config: Config, root: str, answer: object) -> Iterator[Result]:
    """``answer``: this run's control query of the instance, when the control check runs:
    why the client could not even start ("... command not found"), or no answer (wedged)."""
    detail = getattr(answer, "exec_error", None) or getattr(answer, "detail", "")
    status = getattr(answer, "status", "")
    missing = str(detail) if status == "exec-failed" and "not found" in str(detail) else ""
    wedged = status == "timeout"
    want = expected_uid(config.mps.daemon_user, pipe)
    claimants = live_daemons(inst, procs, pipe, root)
    live = [p for p in claimants if want is None or p.uid == want]
    for p in claimants if want is not None else ():
        if p.uid != want:  # another uid's control process naming the pipe dir: a stray
            yield Result(NAME, WARNING, "daemon-foreign", inst.name,
                         f"control process {p.pid} of uid {p.uid} names {inst.pipe_dir}, whose "
                         f"daemon runs as uid {want}: it is not counted as the daemon",
                         f"find out who started it ('ps -o pid,user,lstart,args -p {p.pid}'); "
                         "end it by PID if it is not wanted")
    reset = reset_action(inst.name)
    severity = WARNING if inst.layout == "per-job" else CRITICAL
    if not live and missing:
        # The cause, in one line: no daemon can run here, and a reset cannot change that.
        yield Result(NAME, severity, "mps-not-installed", inst.name,
                     f"MPS is not installed on this node ({missing}): no control daemon can "
                     f"serve {inst.pipe_dir}",
                     "install the NVIDIA driver's MPS binaries (nvidia-cuda-mps-control, "
                     "nvidia-cuda-mps-server), or set commands.nvidia-cuda-mps-control to "
                     "the binary's path; a reset cannot help before that", (("daemon_up", 0.0),))
        return
    if not live:
        stale = []
        if pipe is not None and pipe.kind == "dir":
            if pipe.pid_file:
                stale.append(f"pid file names {pipe.pid_file}, which is not a live daemon")
            if any(e.name == "control" for e in pipe.entries):
                stale.append("control socket left behind")
        yield Result(NAME, severity, "daemon-stale" if stale else "daemon-absent", inst.name,
                     f"no live nvidia-cuda-mps-control for {inst.pipe_dir}: " + "; ".join(stale)
                     + " (clients silently run without MPS)" if stale
                     else f"no nvidia-cuda-mps-control serves {inst.pipe_dir}",
                     reset.text, (("daemon_up", 0.0),), commands=reset.commands)
        return
    if len(live) > 1:
        pids = ", ".join(str(p.pid) for p in live)
        yield Result(NAME, CRITICAL, "daemon-duplicate", inst.name,
                     f"{len(live)} control daemons share {inst.pipe_dir} (pids {pids})",
                     reset.text, (("daemon_up", 0.0 if wedged else 1.0),),
                     commands=reset.commands)
        return
    daemon = live[0]
    values = (("daemon_up", 0.0 if wedged else 1.0), ("daemon_pid", float(daemon.pid)))
    if daemon.state in ("T", "t"):
        # Not up: it runs, but serves no one until it is continued (SIGCONT), which keeps
        # its servers and their clients where a reset would end them.
        go_on = advice(f"run 'kill -CONT {daemon.pid}' (the jobs it serves go on), or ",
                       ("mps-health", "remediate", "unblock", inst.name),
                       "; a reset would end them")
        yield Result(NAME, CRITICAL, "daemon-stopped", inst.name,
                     f"control daemon {daemon.pid} is stopped (state {daemon.state}): "
                     "every client and query hangs",
                     go_on.text, (("daemon_up", 0.0), values[1]), commands=go_on.commands)
        return
    if daemon.state == "D":
        then = advice("if this persists, check the GPU driver (dmesg) and then ", reset)
        yield Result(NAME, WARNING, "daemon-uninterruptible", inst.name,
                     f"control daemon {daemon.pid} is in uninterruptible sleep (state D)",
                     then.text, values, commands=then.commands)
        return
    if config.mps.forbid_root_daemon and daemon.uid == 0:
        yield Result(NAME, CRITICAL, "daemon-root", inst.name,
                     f"control daemon {daemon.pid} runs as root where per-user daemons are "
                     "required: any user can send it privileged commands", reset.text, values,
                     commands=reset.commands)
        return
    # Wedged: the control check's control-wedged is the finding; here only the number.
    yield Result(NAME, OK, "ok", inst.name, f"control daemon {daemon.pid} runs for "
                 f"{inst.pipe_dir} but did not answer this run's query (see the control check)"
                 if wedged else f"control daemon {daemon.pid} serves {inst.pipe_dir}", "", values)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    dirs: Mapping[str, DirFact] = facts.get("dirs")
    answers = facts.sources.get("control")  # there when the control check runs too
    for inst in facts.instances:
        answer = answers.get(inst.name) if isinstance(answers, dict) else None
        yield from _judge_instance(inst, procs, dirs.get(inst.pipe_dir), config, facts.root, answer)
    if facts.instances_over_cap:
        yield Result(NAME, WARNING, "instances-capped", "",
                     f"{facts.instances_over_cap} more per-job instances than mps.max_instances "
                     f"({config.mps.max_instances}) were not judged this run",
                     "look at why so many jobs run MPS here; raise mps.max_instances if that "
                     "is expected")
    if not facts.instances:
        yield Result(NAME, OK, "ok", "", "no MPS instance on this node (per-job layout, no job)")

