"""compute-mode: each GPU's compute mode is what the site expects; no MIG under MPS.

Expected (section ``gpu``): EXCLUSIVE_PROCESS on GPUs MPS serves (``gpu.mps_gpus``, else
the per-gpu layout's ``mps.gpus``, else all: then only the MPS server holds a context),
DEFAULT on others; any GPU may have its own mode by index or UUID, or ``any``. An
unexpected PROHIBITED is CRITICAL (no CUDA context at all), any other difference a
WARNING; no NVML (no driver) is UNKNOWN, never CRITICAL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from mps_health.checks.common import nvml_unavailable
from mps_health.config.load import Config, mps_gpu_ids
from mps_health.config.slurm import GpuSettings, gpu_settings
from mps_health.engine import registry
from mps_health.model.facts import Facts
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, Result, ok

if TYPE_CHECKING:  # fact types only: few runs run the check
    from mps_health.probes.nvml import GpuFact, NvmlFacts

NAME = "compute-mode"
CODES = ("compute-mode-mismatch", "compute-mode-unreadable", "gpu-lost", "mig-change-pending",
         "mig-on-mps-gpu", "mps-gpu-missing", "no-gpus", "nvml-unavailable")

registry.check(NAME, f"{__name__}:check", ("nvml",), default_on=False,
               when_configured=("gpu",), order=100,
               summary="each GPU's compute mode is the expected one; no MIG under MPS")


def judge_gpu(gpu: GpuFact, mps: bool, gs: GpuSettings) -> Iterator[Result]:
    inst = f"gpu{gpu.gpu_index}"
    name = f"GPU {gpu.gpu_index}" + (f" ({gpu.uuid})" if gpu.uuid else "")
    if gpu.lost:
        yield Result(NAME, CRITICAL, "gpu-lost", inst,
                     f"{name} has fallen off the bus (NVML: GPU_IS_LOST)",
                     "drain the node and reset the GPU or reboot; look at dmesg (Xid 79)")
        return
    want = next((mode for key, mode in gs.modes if key in (str(gpu.gpu_index), gpu.uuid)),
                gs.mode_mps if mps else gs.mode_other)
    role = "served by MPS" if mps else "not served by MPS"
    if gpu.compute_mode is None:
        why = ", ".join(e for e in gpu.errors if e.startswith("compute_mode")) or "no answer"
        yield Result(NAME, UNKNOWN, "compute-mode-unreadable", inst,
                     f"cannot read the compute mode of {name}: {why}",
                     "run mps-health as root; check nvidia-smi -q -d COMPUTE")
    elif want != "any" and gpu.compute_mode != want:
        severity = CRITICAL if gpu.compute_mode == "PROHIBITED" else WARNING
        yield Result(NAME, severity, "compute-mode-mismatch", inst,
                     f"{name} is in compute mode {gpu.compute_mode}, expected "
                     f"{want} ({role})",
                     f"run: nvidia-smi -i {gpu.gpu_index} -c {want} (as root, while no job uses "
                     "it), or set gpu.compute_mode in the config", (("compute_mode_ok", 0.0),))
    else:
        yield ok(NAME, inst, f"{name} is in compute mode {gpu.compute_mode} "
                 f"({role}{'' if want != 'any' else ', any mode accepted'})", compute_mode_ok=1.0)
    if mps and gpu.mig_current and gs.mig == "warn":
        yield Result(NAME, WARNING, "mig-on-mps-gpu", inst,
                     f"{name} has MIG enabled but MPS is configured to serve it: "
                     "clients reach MIG instances, not the GPU the site planned for",
                     f"disable MIG (nvidia-smi -i {gpu.gpu_index} -mig 0, then reset the GPU), "
                     "take the GPU out of gpu.mps_gpus, or set gpu.mig: allow if MPS on MIG "
                     "is meant")
    if gpu.mig_current is not None and gpu.mig_pending is not None \
            and gpu.mig_current != gpu.mig_pending:
        yield Result(NAME, WARNING, "mig-change-pending", inst,
                     f"{name} has a MIG mode change pending "
                     f"({'on' if gpu.mig_current else 'off'} -> "
                     f"{'on' if gpu.mig_pending else 'off'}) until it is reset",
                     f"drain the node, then nvidia-smi -i {gpu.gpu_index} -r")


def check(facts: Facts, config: Config) -> Iterator[Result]:
    gs = gpu_settings(config)
    mps_ids = mps_gpu_ids(config)
    nvml: NvmlFacts = facts.sources["nvml"]  # type: ignore[assignment]
    if not nvml.available:
        yield nvml_unavailable(NAME, nvml)
        return
    if not nvml.gpus:
        yield Result(NAME, CRITICAL if mps_ids else WARNING, "no-gpus", "",
                     "NVML sees no GPU on this node", "look at nvidia-smi and dmesg")
        return
    for gpu in nvml.gpus:  # served by MPS: by index or UUID, or every GPU where none named
        mps = mps_ids is None or str(gpu.gpu_index) in mps_ids or gpu.uuid in mps_ids
        yield from judge_gpu(gpu, mps, gs)
    for wanted in mps_ids or ():
        if not any(str(g.gpu_index) == wanted or g.uuid == wanted for g in nvml.gpus):
            yield Result(NAME, CRITICAL, "mps-gpu-missing", f"gpu{wanted}",
                         f"MPS is configured to serve GPU {wanted}, but NVML sees no such GPU "
                         f"({len(nvml.gpus)} GPUs: "
                         f"{', '.join(str(g.gpu_index) for g in nvml.gpus)})",
                         "find the missing GPU (nvidia-smi, dmesg) or fix mps.gpus / "
                         "gpu.mps_gpus")
