"""gres-drift: Slurm's view of the node's GPUs and MPS agrees with the node itself.

Drifted apart, the scheduler places jobs where MPS is gone, or on GPUs that are not
there. Compared: Slurm's ``gpu:N`` with NVML and gres.conf; its ``mps:M`` with
``slurm.mps_per_gpu`` times the GPUs offering mps; gres.conf ``File=`` devices (missing,
not a device, a minor no GPU has); every GPU offered mps has an instance with a live
daemon (node, per-gpu layouts); every running mps job past ``slurm.job_grace_s`` has a
live daemon and every per-job daemon such a job. The node's state is context, never a
failure (a drain by mps-health is no new problem); Slurm unreachable is UNKNOWN.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Iterator, List, Mapping, Optional, Tuple

from mps_health.checks.common import live_daemons, nvml_unavailable, reset_action, slurm_unavailable
from mps_health.config.load import Config, mps_gpu_ids
from mps_health.config.slurm import SlurmSettings, gpu_settings, settings
from mps_health.engine import registry
from mps_health.model.facts import DirFact, Facts, Instance, ProcessFact
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, Result, ok

if TYPE_CHECKING:  # fact types only: few runs run the check
    from mps_health.model.slurm_facts import SlurmFacts, SlurmNode
    from mps_health.probes.gres_conf import DeviceFile, GresConf
    from mps_health.probes.nvml import NvmlFacts

NAME = "gres-drift"
CODES = ("gpu-count", "gres-conf-gpu-count", "gres-conf-invalid", "gres-file-minor",
         "gres-file-missing", "gres-file-not-device", "gres-gpu-count", "gres-mps-count",
         "mps-daemon-no-job", "mps-gpu-no-daemon", "mps-gpu-not-offered", "mps-gpu-unserved",
         "mps-job-no-daemon", "nvml-unavailable", "slurm-jobs-unavailable", "slurm-unavailable")

registry.check(NAME, f"{__name__}:check", ("slurm", "nvml", "gres_conf", "processes", "dirs"),
               default_on=False, when_configured=("slurm",), order=110,
               summary="Slurm's GPUs and mps agree with NVML, gres.conf and the daemons")

RECONFIGURE = "fix gres.conf or the node's Gres= in slurm.conf, then 'scontrol reconfigure'"


def node_context(node: SlurmNode, cfg: SlurmSettings) -> Result:
    drained = any(f in ("DRAIN", "DRAINING", "DRAINED") for f in node.flags)
    ours = drained and node.reason_is(cfg.drain_tag)
    reason = f", reason '{node.reason}'" if node.reason else ""
    whose = " (drained by mps-health)" if ours else ""
    return ok(NAME, "", f"Slurm: node {node.name} is {node.state}{reason}{whose}",
              node_drained=1.0 if drained else 0.0, node_drained_by_us=1.0 if ours else 0.0)


def gres_total(node: SlurmNode, name: str) -> int:
    return sum(g.quantity for g in node.gres if g.name == name)


def file_minor(dev: DeviceFile) -> Optional[int]:
    """The GPU minor a gres.conf File= names: the device's minor, else /dev/nvidiaN's N."""
    if dev.kind == "char" and dev.minor is not None:
        return dev.minor
    base = os.path.basename(dev.path)
    digits = base[len(base.rstrip("0123456789")):]
    return int(digits) if digits else None


def _files(conf: GresConf, name: str) -> List[str]:
    return list(dict.fromkeys(f for line in conf.lines if line.name == name for f in line.files))


def judge_counts(node: SlurmNode, nvml: Optional[NvmlFacts], conf: GresConf,
                 cfg: SlurmSettings, config: Config) -> Iterator[Result]:
    slurm_gpus = gres_total(node, "gpu")
    nvml_gpus = len(nvml.gpus) if nvml is not None else None
    gpu_lines = [ln for ln in conf.lines if ln.name == "gpu"]
    conf_gpus = sum(ln.quantity for ln in gpu_lines) if gpu_lines else None
    mig = nvml is not None and any(g.mig_current for g in nvml.gpus)
    values = (("slurm_gpus", float(slurm_gpus)),) + \
        ((("nvml_gpus", float(nvml_gpus)),) if nvml_gpus is not None else ())
    if nvml_gpus is not None and not mig and slurm_gpus != nvml_gpus:
        yield Result(NAME, CRITICAL, "gres-gpu-count", "",
                     f"Slurm offers gpu:{slurm_gpus} on {node.name} but NVML sees "
                     f"{nvml_gpus} GPUs", "find the missing GPU (nvidia-smi, dmesg); "
                     + RECONFIGURE, values)
    elif conf_gpus is not None and not mig \
            and conf_gpus != (nvml_gpus if nvml_gpus is not None else slurm_gpus):
        seen = f"NVML sees {nvml_gpus} GPUs" if nvml_gpus is not None \
            else f"Slurm offers gpu:{slurm_gpus}"
        yield Result(NAME, CRITICAL, "gres-conf-gpu-count", "",
                     f"gres.conf lists {conf_gpus} gpu devices for {node.name} but {seen}",
                     RECONFIGURE, values)
    else:
        yield ok(NAME, "", f"GPU count agrees: Slurm gpu:{slurm_gpus}"
                 + (f", NVML {nvml_gpus}" if nvml_gpus is not None else "")
                 + (f", gres.conf {conf_gpus}" if conf_gpus is not None else "")
                 + (" (MIG enabled: counts not compared)" if mig else ""), **dict(values))
    want = gpu_settings(config).count
    if want is not None and nvml_gpus is not None and nvml_gpus != want:
        yield Result(NAME, CRITICAL, "gpu-count", "",
                     f"this node should have {want} GPUs (gpu.count) but NVML sees {nvml_gpus}",
                     "find the missing GPU (nvidia-smi, dmesg)", values)
    slurm_mps = gres_total(node, "mps")
    if slurm_mps == 0:
        return
    mps_files = _files(conf, "mps")
    mps_ids = mps_gpu_ids(config)
    mps_gpus, basis = (len(mps_files), "gres.conf mps devices") if mps_files \
        else (len(mps_ids), "GPUs MPS serves") if mps_ids is not None \
        else (nvml_gpus if nvml_gpus is not None else slurm_gpus, "GPUs")
    expected = mps_gpus * cfg.mps_per_gpu
    if slurm_mps != expected:
        yield Result(NAME, WARNING, "gres-mps-count", "",
                     f"Slurm offers mps:{slurm_mps} but {mps_gpus} {basis} x "
                     f"{cfg.mps_per_gpu} (slurm.mps_per_gpu) = {expected}", RECONFIGURE,
                     (("slurm_mps", float(slurm_mps)),))
    else:
        yield ok(NAME, "", f"mps count agrees: mps:{slurm_mps} = {mps_gpus} {basis} x "
                 f"{cfg.mps_per_gpu}", slurm_mps=float(slurm_mps))


def judge_files(conf: GresConf, nvml: Optional[NvmlFacts]) -> Iterator[Result]:
    minors = {g.minor for g in nvml.gpus if g.minor is not None} if nvml else set()
    for dev in conf.devices:
        if dev.kind == "missing":
            yield Result(NAME, CRITICAL, "gres-file-missing", "",
                         f"gres.conf names {dev.path}, which does not exist", RECONFIGURE)
        elif dev.kind not in ("char",):
            yield Result(NAME, CRITICAL, "gres-file-not-device", "",
                         f"gres.conf names {dev.path}, which is a {dev.kind}, not a character "
                         "device: slurmd rejects it and jobs get no CUDA_VISIBLE_DEVICES",
                         RECONFIGURE)
        elif minors and file_minor(dev) not in minors:  # no NVML: no minors
            yield Result(NAME, CRITICAL, "gres-file-minor", "",
                         f"gres.conf names {dev.path} (minor {file_minor(dev)}), but NVML's GPUs "
                         f"have minors {', '.join(str(m) for m in sorted(minors))}", RECONFIGURE)
    for line in conf.errors:
        yield Result(NAME, WARNING, "gres-conf-invalid", "", f"gres.conf: {line}",
                     "fix the line (slurmd may refuse or misread it)")


def _index_of_minor(nvml: Optional[NvmlFacts], minor: Optional[int]) -> Optional[str]:
    """The NVML index of the GPU with this minor (they differ: index is PCI order)."""
    if minor is None:
        return None
    if nvml is None:
        return str(minor)  # without NVML, /dev/nvidiaN is taken to be GPU N
    return next((str(g.gpu_index) for g in nvml.gpus if g.minor == minor), None)


def judge_resident(node: SlurmNode, conf: GresConf, nvml: Optional[NvmlFacts],
                   insts: Tuple[Instance, ...], procs: Tuple[ProcessFact, ...],
                   dirs: Mapping[str, DirFact], root: str, config: Config) -> Iterator[Result]:
    from mps_health.probes.gres_conf import DeviceFile  # only where the check runs

    if gres_total(node, "mps") == 0:
        return
    devices = {d.path: d for d in conf.devices}
    files, ids = _files(conf, "mps"), mps_gpu_ids(config)
    indices = (_index_of_minor(nvml, file_minor(devices.get(p, DeviceFile(p, "?")))) for p in files)
    offered = list(dict.fromkeys(i for i in indices if i is not None))
    if not offered:  # no File= for mps (AutoDetect): the GPUs MPS serves, or every GPU
        offered = list(ids) if ids is not None else \
            [str(g.gpu_index) for g in (nvml.gpus if nvml else ())]
    for gpu in offered:
        uuid = next((g.uuid for g in (nvml.gpus if nvml else ()) if str(g.gpu_index) == gpu), None)
        inst = next((i for i in insts if i.layout == "node" or i.gpu in (gpu, uuid)), None)
        if inst is None:
            yield Result(NAME, CRITICAL, "mps-gpu-unserved", f"gpu{gpu}",
                         f"Slurm offers mps on GPU {gpu} but no MPS instance serves it: mps "
                         "jobs there run without MPS",
                         "add the GPU to mps.gpus (and start its daemon), or remove "
                         "Name=mps for it from gres.conf")
        elif not live_daemons(inst, procs, dirs.get(inst.pipe_dir), root):
            reset = reset_action(inst.name)
            yield Result(NAME, CRITICAL, "mps-gpu-no-daemon", f"gpu{gpu}",
                         f"Slurm offers mps on GPU {gpu} but the control daemon of {inst.name} "
                         f"({inst.pipe_dir}) is not running: mps jobs there run without MPS",
                         reset.text, commands=reset.commands)
        else:
            yield ok(NAME, f"gpu{gpu}", f"Slurm offers mps on GPU {gpu}, served by {inst.name}")
    for gpu in ids or () if files else ():
        if gpu.isdigit() and gpu not in offered:
            yield Result(NAME, WARNING, "mps-gpu-not-offered", f"gpu{gpu}",
                         f"MPS serves GPU {gpu} but gres.conf offers no mps on it: Slurm "
                         "never places mps jobs there", RECONFIGURE)


def judge_per_job(slurm: SlurmFacts, node: SlurmNode, insts: Tuple[Instance, ...],
                  procs: Tuple[ProcessFact, ...], dirs: Mapping[str, DirFact], root: str,
                  cfg: SlurmSettings, unjudged: Mapping[str, str]) -> Iterator[Result]:
    from mps_health.probes.jobs import gres_count  # only where the check runs

    live: Dict[str, List[int]] = {}
    for inst in insts:
        for p in live_daemons(inst, procs, dirs.get(inst.pipe_dir), root) if inst.job_id else ():
            live.setdefault(inst.job_id or "", []).append(p.pid)
    if slurm.jobs is None:
        used = [g for g in node.gres_used or () if g.name == "mps" and g.quantity > 0]
        if used and not live:
            where = ", ".join(str(i) for g in used for i in (g.indices or ()))
            yield Result(NAME, CRITICAL, "mps-job-no-daemon", "",
                         f"Slurm shows mps in use{' on GPU ' + where if where else ''} but no "
                         "per-job MPS daemon runs", "look at the prolog's log")
        yield Result(NAME, UNKNOWN, "slurm-jobs-unavailable", "",
                     f"cannot list this node's jobs: {slurm.jobs_error}",
                     "check slurmctld ('scontrol ping'); this is not an MPS failure")
        return
    mps_jobs = {j.job_id: j for j in slurm.jobs
                if gres_count(j, "mps") is not None and j.state == "RUNNING"}
    for job in mps_jobs.values():
        if job.job_id in live:
            yield ok(NAME, f"job{job.job_id}", f"job {job.job_id} ({job.user}) holds mps and "
                     f"its daemon {live[job.job_id][0]} runs")
        elif job.job_id in unjudged:  # our hooks are setting it up or tearing it down
            yield ok(NAME, f"job{job.job_id}", f"job {job.job_id}: {unjudged[job.job_id]}")
        elif job.elapsed_s is not None and job.elapsed_s < cfg.job_grace_s:
            yield ok(NAME, f"job{job.job_id}", f"job {job.job_id} started "
                     f"{job.elapsed_s:.0f}s ago: its prolog may still be starting MPS")
        else:
            yield Result(NAME, CRITICAL, "mps-job-no-daemon", f"job{job.job_id}",
                         f"job {job.job_id} ({job.user}) holds {job.gres} but no MPS daemon "
                         "runs for it: its CUDA clients run without MPS",
                         "look at the prolog's log; requeue the job once MPS starts")
    for job_id, pids in sorted(live.items()):
        if job_id not in mps_jobs:
            other = next((j for j in slurm.jobs if j.job_id == job_id), None)
            why = f"job {job_id} is {other.state} without mps" if other is not None \
                else f"job {job_id} does not run on {node.name}"
            reset = reset_action(f"job{job_id}")
            yield Result(NAME, WARNING, "mps-daemon-no-job", f"job{job_id}",
                         f"MPS daemon {pids[0]} serves job {job_id}, but {why}",
                         reset.text, commands=reset.commands)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    cfg = settings(config)
    slurm: SlurmFacts = facts.sources["slurm"]  # type: ignore[assignment]
    nvml_facts: NvmlFacts = facts.sources["nvml"]  # type: ignore[assignment]
    conf: GresConf = facts.sources["gres_conf"]  # type: ignore[assignment]
    procs: Tuple[ProcessFact, ...] = facts.sources["processes"]  # type: ignore[assignment]
    dirs: Mapping[str, DirFact] = facts.sources["dirs"]  # type: ignore[assignment]
    nvml: Optional[NvmlFacts] = nvml_facts if nvml_facts.available else None
    if nvml is None:
        yield nvml_unavailable(NAME, nvml_facts)
    yield from judge_files(conf, nvml)
    if slurm.node is None:
        yield slurm_unavailable(NAME, slurm)
        return
    node = slurm.node
    yield node_context(node, cfg)
    yield from judge_counts(node, nvml, conf, cfg, config)
    if config.mps.layout == "per-job":
        yield from judge_per_job(slurm, node, facts.instances, procs, dirs, facts.root, cfg,
                                 dict(facts.unjudged))
    else:
        yield from judge_resident(node, conf, nvml, facts.instances, procs, dirs, facts.root,
                                  config)

