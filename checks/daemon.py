"""daemon: a live (not zombie) nvidia-cuda-mps-control serves each instance.

Neither the control socket nor the pid file proves a daemon is alive (both survive a
SIGKILL), so liveness comes from the process table: a control process whose
CUDA_MPS_PIPE_DIRECTORY is the instance's pipe dir, or, where environ is unreadable,
the live control process the pid file names.

``daemon_up`` (perfdata, the exporter, the fleet alert's ``count(daemon_up == 0)``) is 1
only for a daemon that can serve: 0 when none runs, when it is stopped (SIGSTOP: every
client hangs), and when this run's control query got no answer from it (wedged; the
control check reports ``control-wedged``), so a fleet-wide wedge counts as daemons down.
"""

from __future__ import annotations

from typing import Iterator, List, Mapping, Optional, Tuple

from mps_health.checks.common import live_daemons
from mps_health.config.load import Config
from mps_health.model import registry
from mps_health.model.facts import DirFact, Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, OK, WARNING, Result, ok
from mps_health.probes.instances import expected_uid

NAME = "daemon"
# Every code this check reports besides ok (each has a runbook entry in README.md).
CODES = ("daemon-absent", "daemon-duplicate", "daemon-root", "daemon-stale", "daemon-stopped",
         "daemon-uninterruptible", "daemon-foreign", "instances-capped", "mps-not-installed")

registry.check(NAME, f"{__name__}:check", ("processes", "dirs"), order=10,
               summary="a live control daemon serves each instance")


def _reset(inst: Instance) -> str:
    return f"run 'mps-health remediate reset {inst.name}' (dry run first: --dry-run)"


def _foreign(inst: Instance, strangers: List[ProcessFact], want: int) -> Iterator[Result]:
    """Control processes of another uid naming the pipe dir: strays, never the daemon."""
    for p in strangers:
        yield Result(NAME, WARNING, "daemon-foreign", inst.name,
                     f"control process {p.pid} of uid {p.uid} names {inst.pipe_dir}, whose "
                     f"daemon runs as uid {want}: it is not counted as the daemon",
                     f"find out who started it ('ps -o pid,user,lstart,args -p {p.pid}'); "
                     "end it by PID if it is not wanted")


def _judge_instance(inst: Instance, procs: Tuple[ProcessFact, ...], pipe: Optional[DirFact],
                    config: Config, root: str, missing: str = "", wedged: bool = False
                    ) -> Iterator[Result]:
    want = expected_uid(config.mps.daemon_user, pipe)
    claimants = live_daemons(inst, procs, pipe, root)
    live = [p for p in claimants if want is None or p.uid == want]
    if want is not None:
        yield from _foreign(inst, [p for p in claimants if p.uid != want], want)
    severity = WARNING if inst.layout == "per-job" else CRITICAL
    if not live and missing:
        # The cause, in one line: no daemon can run here, and a reset cannot change that.
        yield Result(NAME, severity, "mps-not-installed", inst.name,
                     f"MPS is not installed on this node ({missing}): no control daemon can "
                     f"serve {inst.pipe_dir}",
                     "install the NVIDIA driver's MPS binaries (nvidia-cuda-mps-control, "
                     "nvidia-cuda-mps-server), or set commands.nvidia-cuda-mps-control to "
                     "the binary's path; a reset cannot help before that",
                     (("daemon_up", 0.0),))
        return
    if not live:
        stale = []
        if pipe is not None and pipe.kind == "dir":
            names = {e.name for e in pipe.entries}
            if pipe.pid_file:
                stale.append(f"pid file names {pipe.pid_file}, which is not a live daemon")
            if "control" in names:
                stale.append("control socket left behind")
        if stale:
            yield Result(NAME, severity, "daemon-stale", inst.name,
                         f"no live nvidia-cuda-mps-control for {inst.pipe_dir}: "
                         + "; ".join(stale) + " (clients silently run without MPS)",
                         _reset(inst), (("daemon_up", 0.0),))
        else:
            yield Result(NAME, severity, "daemon-absent", inst.name,
                         f"no nvidia-cuda-mps-control serves {inst.pipe_dir}",
                         _reset(inst), (("daemon_up", 0.0),))
        return
    if len(live) > 1:
        pids = ", ".join(str(p.pid) for p in live)
        yield Result(NAME, CRITICAL, "daemon-duplicate", inst.name,
                     f"{len(live)} control daemons share {inst.pipe_dir} (pids {pids})",
                     _reset(inst), (("daemon_up", 0.0 if wedged else 1.0),))
        return
    daemon = live[0]
    values = (("daemon_up", 0.0 if wedged else 1.0), ("daemon_pid", float(daemon.pid)))
    if daemon.state in ("T", "t"):
        # Not up: it runs, but serves no one until it is continued (SIGCONT) or reset.
        yield Result(NAME, CRITICAL, "daemon-stopped", inst.name,
                     f"control daemon {daemon.pid} is stopped (state {daemon.state}): "
                     "every client and query hangs", _reset(inst),
                     (("daemon_up", 0.0), ("daemon_pid", float(daemon.pid))))
        return
    if daemon.state == "D":
        yield Result(NAME, WARNING, "daemon-uninterruptible", inst.name,
                     f"control daemon {daemon.pid} is in uninterruptible sleep (state D)",
                     "if this persists, check the GPU driver (dmesg) and then "
                     + _reset(inst), values)
        return
    if config.mps.forbid_root_daemon and daemon.uid == 0:
        yield Result(NAME, CRITICAL, "daemon-root", inst.name,
                     f"control daemon {daemon.pid} runs as root where per-user daemons are "
                     "required: any user can send it privileged commands", _reset(inst), values)
        return
    if wedged:  # the control check's control-wedged is the finding; here only the number
        yield ok(NAME, inst.name, f"control daemon {daemon.pid} runs for {inst.pipe_dir} but "
                 "did not answer this run's query (see the control check)",
                 daemon_up=0.0, daemon_pid=float(daemon.pid))
        return
    yield ok(NAME, inst.name, f"control daemon {daemon.pid} serves {inst.pipe_dir}",
             daemon_up=1.0, daemon_pid=float(daemon.pid))


def _binary_missing(answers: object, name: str) -> str:
    """Why the control client could not even start ("... command not found"), or ""."""
    answer = answers.get(name) if isinstance(answers, dict) else None
    detail = getattr(answer, "exec_error", None) or getattr(answer, "detail", "")
    if getattr(answer, "status", "") == "exec-failed" and "not found" in str(detail):
        return str(detail)
    return ""


def _unanswered(answers: object, name: str) -> bool:
    """Did this run's control query get no answer from the instance's daemon in time?"""
    answer = answers.get(name) if isinstance(answers, dict) else None
    return getattr(answer, "status", "") == "timeout"


def check(facts: Facts, config: Config) -> Iterator[Result]:
    procs: Tuple[ProcessFact, ...] = facts.get("processes")
    dirs: Mapping[str, DirFact] = facts.get("dirs")
    answers = facts.sources.get("control")  # there when the control check runs too
    for inst in facts.instances:
        yield from _judge_instance(inst, procs, dirs.get(inst.pipe_dir), config, facts.root,
                                   _binary_missing(answers, inst.name),
                                   _unanswered(answers, inst.name))
    if facts.instances_over_cap:
        yield Result(NAME, WARNING, "instances-capped", "",
                     f"{facts.instances_over_cap} more per-job instances than mps.max_instances "
                     f"({config.mps.max_instances}) were not judged this run",
                     "look at why so many jobs run MPS here; raise mps.max_instances if that "
                     "is expected")
    if not facts.instances:
        yield Result(NAME, OK, "ok", "", "no MPS instance on this node (per-job layout, no job)")

