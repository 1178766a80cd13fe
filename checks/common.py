"""Helpers several checks share: an instance's live daemons, the one UNKNOWN line each for
facts from NVML or Slurm, and the pieces many findings are built of. Checks import this
module and never one another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from mps_health.engine.actionhints import RESET, Advice, advice
from mps_health.model.facts import DirFact, Instance, ProcessFact
from mps_health.model.printable import escape
from mps_health.model.results import UNKNOWN, Result
from mps_health.probes.instances import pipe_paths
from mps_health.probes.process_identity import is_daemon

if TYPE_CHECKING:
    from mps_health.model.slurm_facts import SlurmFacts
    from mps_health.probes.nvml import NvmlFacts

T = TypeVar("T")
PING = "check slurmctld ('scontrol ping'); this is not an MPS failure"
K = TypeVar("K")


def reset_action(name: str) -> Advice:
    """The action that restarts instance ``name``'s MPS, its dry run first."""
    return advice("run ", (*RESET, name), " (dry run first: --dry-run)")


def user_of(user: Optional[str], uid: Optional[int], unknown: str) -> str:
    """Who a process runs as: its user name (escaped), else its uid, else ``unknown``."""
    return escape(user) if user else (f"uid {uid}" if uid is not None else unknown)


def group(items: Iterable[T], key: Callable[[T], K]) -> Dict[K, List[T]]:
    """``items`` by ``key``, each list in their order (one finding per group)."""
    out: Dict[K, List[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def present(*pairs: Tuple[str, Optional[float]]) -> Tuple[Tuple[str, float], ...]:
    """A Result's values: the (name, number) pairs whose number is known."""
    return tuple((k, float(v)) for k, v in pairs if v is not None)


def some(names: List[str], shown: int, sep: str = ", ") -> str:
    """The first ``shown`` of ``names`` and how many more ("1, 2 and 3 more")."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return sep.join(names[:shown]) + more


# The last process list indexed, and its index: every instance of a run is judged
# against the same tuple, so it is indexed once per run, not scanned per instance.
_indexed: List[Any] = [None, None]


def _controls(procs: Tuple[ProcessFact, ...]) -> Tuple[Dict[Optional[str], List[int]],
                                                       Dict[int, List[int]]]:
    """Positions in ``procs`` of the live control daemons (``is_daemon``), by pipe dir and
    by pid."""
    if _indexed[0] is not procs:
        at = [i for i, p in enumerate(procs) if is_daemon(p)]
        _indexed[:] = [procs, (group(at, lambda i: procs[i].pipe_dir),
                               group(at, lambda i: procs[i].pid))]
    return _indexed[1]


def live_daemons(inst: Instance, procs: Tuple[ProcessFact, ...], pipe: Optional[DirFact],
                 root: str = "/") -> List[ProcessFact]:
    """The live control daemons serving ``inst``, by environ or else by pid file: never
    a client of the control binary nor a process running another binary (``is_daemon``)."""
    by_dir, by_pid = _controls(procs)
    at = sorted(i for path in set(pipe_paths(inst, root)) for i in by_dir.get(path, ()))
    found = [procs[i] for i in at]
    if not found and pipe is not None and pipe.pid_file and pipe.pid_file.isdigit():
        named = int(pipe.pid_file)
        found = [procs[i] for i in by_pid.get(named, ()) if not procs[i].environ_readable]
    return found


def nvml_unavailable(check: str, nvml: NvmlFacts) -> Result:
    """The one UNKNOWN line for a node where NVML cannot be used (shared by GPU checks)."""
    action = {
        "PYNVML_MISSING": "pip install nvidia-ml-py",
        "LIBRARY_NOT_FOUND": "install the NVIDIA driver, or do not enable GPU checks on "
                             "nodes without GPUs",
        "DRIVER_NOT_LOADED": "load the driver (modprobe nvidia) and look at dmesg",
        "NO_PERMISSION": "run mps-health as root",
        "LIB_RM_VERSION_MISMATCH": "reboot the node (or reload the nvidia module)",
    }.get(nvml.error_code or "", "look at dmesg and nvidia-smi")
    return Result(check, UNKNOWN, "nvml-unavailable", "", f"NVML: {nvml.error}", action)


def slurm_unavailable(check: str, slurm: SlurmFacts) -> Result:
    """The UNKNOWN line when Slurm could not be asked (gres-drift, orphans)."""
    action = {
        "timeout": PING, "unreachable": PING,
        "node-unknown": f"Slurm has no node '{slurm.node_name}': set node_name in the config "
                        "(or run under slurmd, which sets SLURMD_NODENAME)",
        "exec-failed": "install the Slurm client or set commands.scontrol in the config",
    }.get(slurm.error_code or "", "run the command by hand to see what Slurm says")
    return Result(check, UNKNOWN, "slurm-unavailable", "", slurm.error or "no Slurm facts", action)
