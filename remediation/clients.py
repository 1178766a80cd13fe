"""Which clients are connected to an instance, as far as can be told, and through what.

The control daemon says it best (``get_server_list``, then ``get_client_list PID``);
NVML adds the MPS clients of the instance's GPUs where the driver is there. Without
either, no client is possible if no server of the instance runs (clients only talk to
a server); otherwise it is "unknown", and a reset refuses as if clients were there.
"""

import time
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from mps_health.model.facts import ControlAnswer, Instance, ProcessFact
from mps_health.probes.clientinfo import read_client
from mps_health.probes.context import Context
from mps_health.probes.control import ask_all
from mps_health.probes.nvml import PynvmlApi, read_nvml


class Clients(NamedTuple):
    known: bool  # False: could not tell (then treat as connected)
    servers: Tuple[int, ...]
    pids: Tuple[int, ...]
    how: str  # one line saying how we know


def ask(ctx: Context, inst: Instance, command: str, timeout_s: float) -> ControlAnswer:
    """One control command to one instance, bounded by ``timeout_s``."""
    cfg = ctx.config
    longer = cfg._replace(control=cfg.control._replace(timeout_s=timeout_s))
    sub = ctx._replace(config=longer, deadline=time.monotonic() + timeout_s + 1.0)
    return ask_all(sub, (inst,), command)[inst.name]


def pid_lines(text: str) -> Tuple[int, ...]:
    """PIDs, one a line, as get_server_list and get_client_list print them."""
    return tuple(int(w) for w in text.split() if w.isdigit())


def from_control(ctx: Context, inst: Instance, timeout_s: float) -> Optional[Clients]:
    # "ok": the daemon itself answered (probes.control.classify: the client exits 0 for
    # answers and for most errors); an empty list is an answer.
    servers_answer = ask(ctx, inst, "get_server_list", timeout_s)
    if servers_answer.status != "ok":
        return None
    servers = pid_lines(servers_answer.stdout)
    pids: Dict[int, None] = {}
    for server in servers:
        a = ask(ctx, inst, f"get_client_list {server}", timeout_s)
        if a.status != "ok":
            return None
        pids.update(dict.fromkeys(pid_lines(a.stdout)))
    return Clients(True, servers, tuple(pids), "asked the control daemon")


def nvml_clients(gpus: Sequence[str]) -> Optional[Tuple[int, ...]]:
    """MPS client PIDs on these GPUs (all GPUs if empty), or None if NVML cannot tell."""
    facts = read_nvml(PynvmlApi())
    chosen = [g for g in facts.gpus if not gpus or str(g.gpu_index) in gpus or g.uuid in gpus]
    if not facts.available or any(g.mps_processes is None for g in chosen):
        return None
    return tuple(dict.fromkeys(p.pid for g in chosen for p in g.mps_processes or ()))


def find(ctx: Context, inst: Instance, servers: Sequence[ProcessFact], daemon_answers: bool,
         timeout_s: float) -> Clients:
    """The clients of ``inst``; ``servers`` are its server processes seen in /proc."""
    seen = tuple(s.pid for s in servers)
    control = from_control(ctx, inst, timeout_s) if daemon_answers else None
    nvml: Optional[Tuple[int, ...]] = None
    if inst.layout != "per-job":  # NVML cannot tell per-job instances apart
        nvml = nvml_clients([inst.gpu] if inst.gpu else [])
    if control is not None:
        extra = tuple(p for p in (nvml or ()) if p not in control.pids)
        how = control.how + (" and NVML" if nvml is not None else "")
        return Clients(True, control.servers, control.pids + extra, how)
    if nvml is not None:
        return Clients(True, seen, nvml, "NVML (the control daemon does not answer)")
    if not seen:
        return Clients(True, (), (), "no nvidia-cuda-mps-server of this instance runs")
    return Clients(False, seen, (), f"the control daemon does not answer and server "
                   f"{', '.join(map(str, seen))} runs: clients cannot be ruled out")


def job_of(proc_dir: str, pid: int) -> str:
    """A process's Slurm job for a refusal: "job N" by its job cgroup, "says job N" by a
    SLURM_JOB_ID outside any (its user's word, not held against squeue), "" for none."""
    info = read_client(proc_dir, pid, None)
    if not info.job_id:
        return ""
    return f"job {info.job_id}" if info.job_from == "cgroup" else f"says job {info.job_id}"


def describe(proc_dir: str, pids: Sequence[int]) -> str:
    """Up to 8 client PIDs, each with its job where one is known."""
    parts = [f"{pid} ({job})" if (job := job_of(proc_dir, pid)) else str(pid) for pid in pids[:8]]
    return ", ".join(parts) + (f", +{len(pids) - 8} more" if len(pids) > 8 else "")

