"""Helpers several checks share: finding an instance's live daemons, and the one UNKNOWN
line each for facts that come from NVML or Slurm. Checks import this module and never
one another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from mps_health.hostio.process_identity import is_daemon
from mps_health.model.facts import DirFact, Instance, ProcessFact
from mps_health.model.results import UNKNOWN, Result
from mps_health.probes.instances import pipe_paths

if TYPE_CHECKING:
    from mps_health.probes.nvml import NvmlFacts
    from mps_health.probes.slurm import SlurmFacts


# The last process list indexed, and its index: every instance of a run is judged
# against the same tuple, so it is indexed once per run, not scanned once per instance
# (quadratic with many instances, e.g. a replayed snapshot of thousands).
_indexed: List[Any] = [None, None]


def _controls(procs: Tuple[ProcessFact, ...]) -> Tuple[Dict[Optional[str], List[int]],
                                                       Dict[int, List[int]]]:
    """Positions in ``procs`` of the live control daemons (``is_daemon``), by pipe dir and
    by pid."""
    if _indexed[0] is not procs:
        by_dir: Dict[Optional[str], List[int]] = {}
        by_pid: Dict[int, List[int]] = {}
        for i, p in enumerate(procs):
            if is_daemon(p):
                by_dir.setdefault(p.pipe_dir, []).append(i)
                by_pid.setdefault(p.pid, []).append(i)
        _indexed[:] = [procs, (by_dir, by_pid)]
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
        "timeout": "check slurmctld ('scontrol ping'); this is not an MPS failure",
        "unreachable": "check slurmctld ('scontrol ping'); this is not an MPS failure",
        "node-unknown": f"Slurm has no node '{slurm.node_name}': set node_name in the config "
                        "(or run under slurmd, which sets SLURMD_NODENAME)",
        "exec-failed": "install the Slurm client or set commands.scontrol in the config",
    }.get(slurm.error_code or "", "run the command by hand to see what Slurm says")
    return Result(check, UNKNOWN, "slurm-unavailable", "", slurm.error or "no Slurm facts",
                  action)
