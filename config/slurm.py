"""The ``slurm``, ``orphans`` and ``gpu`` config sections (read with the helpers below)."""

from __future__ import annotations

from functools import partial
from typing import Any, Optional, Tuple

from mps_health.config.schema import (
    Invalid,
    Record,
    Section,
    custom,
    gpu_ids,
    number,
    pathname,
    shown,
    text,
    whole,
)

MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "any")
DEFAULT_TAG = "MPS-HC:"


def _tag(value: Any) -> str:
    tag = text(DEFAULT_TAG).parse(value)
    if any(c.isspace() for c in tag):
        raise Invalid(f"must be one word: it is the drain reason's first word (got {shown(tag)})")
    if tag.upper().startswith("NHC"):
        raise Invalid("must not start with NHC: LBNL NHC would resume our drains")
    return str(tag)


class SlurmSettings(Record):
    timeout_s: float = number(5.0, low=0.1, high=60.0)  # each scontrol/squeue call
    # Accepted so that configs written for the JSON reader still load; ignored: the text
    # answer holds every fact the JSON one gives, on every Slurm version (see
    # docs/runbook-slurm-gpu.md).
    output: str = text("auto", choices=("auto", "text", "json"))
    gres_conf: Optional[str] = pathname(None, optional=True)  # default: beside slurm.conf
    mps_per_gpu: int = whole(100, low=1, high=1_000_000)  # gres.conf Count of mps per GPU
    # A drain reason starting with this is our own: the health check drains and resumes
    # with it, gres-drift and `remediate node` recognise the node's own drains by it.
    drain_tag: str = custom(DEFAULT_TAG, _tag)
    job_grace_s: float = number(60.0, low=0.0, high=86400.0)  # a new job's prolog may take this


class OrphanSettings(Record):
    # Younger per-job dirs are neither judged nor removed: a job may be starting.
    min_age_s: float = number(120.0, low=0.0, high=30 * 86400.0)


def _mode(value: Any, key: str) -> str:
    if not isinstance(value, str) or value.upper() not in {m.upper() for m in MODES}:
        raise Invalid(f"must be one of {', '.join(MODES)} (got {shown(value)})", key)
    return "any" if value.lower() == "any" else value.upper()


DEFAULT_MODES = (("mps", "EXCLUSIVE_PROCESS"), ("other", "DEFAULT"))


def _modes(value: Any) -> Tuple[Tuple[str, str], ...]:
    if isinstance(value, str):
        value = {"mps": value}
    if not isinstance(value, dict):
        raise Invalid("must be a mapping of mps/other/GPU index or UUID to a mode")
    given = {str(k).strip(): _mode(v, str(k)) for k, v in value.items()}
    return tuple({**dict(DEFAULT_MODES), **given}.items())


class GpuSettings(Record):
    # GPUs that run MPS; None (all): from the mps section
    mps_gpus: Optional[Tuple[str, ...]] = custom(None, partial(gpu_ids, all_ok=True))
    # mps/other/GPU index or UUID -> expected compute mode
    compute_mode: Tuple[Tuple[str, str], ...] = custom(DEFAULT_MODES, _modes)
    count: Optional[int] = whole(None, optional=True)  # GPUs this node must have (gres-drift)
    # MIG under MPS is supported by NVIDIA (each MIG compute instance gets its share of
    # the 48 clients): "allow" where the site means it, "warn" (mig-on-mps-gpu) otherwise.
    mig: str = text("warn", choices=("warn", "allow"))

    @property
    def mode_mps(self) -> str:
        return dict(self.compute_mode)["mps"]

    @property
    def mode_other(self) -> str:
        return dict(self.compute_mode)["other"]

    @property
    def modes(self) -> Tuple[Tuple[str, str], ...]:
        """(GPU index or UUID, mode) overrides."""
        return tuple((k, m) for k, m in self.compute_mode if k not in ("mps", "other"))


SLURM = Section("slurm", SlurmSettings)
ORPHANS = Section("orphans", OrphanSettings)
GPU = Section("gpu", GpuSettings)
SECTIONS = (GPU, SLURM, ORPHANS)
settings = SLURM.of
orphan_settings = ORPHANS.of
gpu_settings = GPU.of
