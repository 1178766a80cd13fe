"""The GPUs gres.conf describes, from NVML (``mps_health.probes.nvml``) or a recording:
the probe's own format, or tests/gpu/dump_nvml.py's raw dump (``driver``, ``gpus``), which
:func:`record_from_dump` turns into the first, so both are read as live NVML is.
"""

import json
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from mps_health.probes.nvml import (
    RECORD_FORMAT,
    RECORD_VERSION,
    NvmlFacts,
    PynvmlApi,
    RecordedApi,
    read_nvml,
)


class GpusError(Exception):
    """The GPUs cannot be described (one line: what is wrong, what to do)."""


class NvmlUnavailable(GpusError):
    """NVML answered nothing here (no driver, no library): a node without GPUs to describe."""


class GresGpu(NamedTuple):
    gpu_index: int  # NVML index (PCI bus order)
    minor: int  # N of /dev/nvidiaN
    name: str
    uuid: str
    mps: bool  # gets a Name=mps line
    mig: bool  # MIG on: Slurm's gres/mps cannot use it


def _answer(value: Any) -> Any:
    """dump_nvml.py writes a failed NVML call as the string "NVMLError: <text>"."""
    if isinstance(value, str) and value.startswith("NVMLError"):
        words = value.split(":", 1)[-1].strip().upper().replace(" ", "_")
        return {"error": words or "UNKNOWN"}
    return value


def record_from_dump(dump: Mapping[str, Any]) -> Dict[str, Any]:
    """tests/gpu/dump_nvml.py's JSON -> the probe's recording format."""
    gpus = dump.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise ValueError("an NVML dump needs a list 'gpus' of mappings")
    devices = []
    for g in gpus:
        device: Dict[str, Any] = {
            field: _answer(g[key]) for field, key in (
                ("uuid", "uuid"), ("minor", "minor"), ("name", "name"),
                ("compute_mode", "compute_mode"), ("mig_mode", "mig_mode"),
                ("persistence_mode", "persistence")) if key in g}
        for field in ("compute_processes", "mps_processes"):
            value = _answer(g.get(field, []))
            if isinstance(value, list):
                value = [[p.get("pid"), p.get("used_memory")] for p in value
                         if isinstance(p, dict)]
            device[field] = value
        devices.append(device)
    return {"format": RECORD_FORMAT, "format_version": RECORD_VERSION, "init_error": None,
            "driver_version": _answer(dump.get("driver", {"error": "NOT_SUPPORTED"})),
            "device_count": len(devices), "devices": devices}


def load_recording(text: str, where: str) -> RecordedApi:
    """A RecordedApi from either recording format; ValueError naming ``where``."""
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "format" not in data and "gpus" in data:
            data = record_from_dump(data)
        return RecordedApi(data)
    except ValueError as e:
        what = "not JSON: " if isinstance(e, json.JSONDecodeError) else ""
        raise ValueError(f"{where}: {what}{e}") from None


def nvml_facts(recording: Optional[str] = None) -> NvmlFacts:
    """Live NVML, or the recording in the file ``recording``; GpusError when unusable."""
    if recording is None:
        facts = read_nvml(PynvmlApi())
    else:
        from mps_health.hostio.safefiles import read_small

        try:
            data = read_small(recording, 64 << 20, follow=True)
        except OSError as e:
            raise GpusError(f"{recording}: cannot read: {e.strerror}") from None
        if data is None:
            raise GpusError(f"{recording}: cannot read: No such file or directory")
        try:
            facts = read_nvml(load_recording(data.decode("utf-8", "replace"), recording))
        except ValueError as e:
            raise GpusError(str(e)) from None
    if not facts.available:
        raise NvmlUnavailable(f"NVML: {facts.error}")
    return facts


def parse_choice(text: str) -> Optional[Tuple[str, ...]]:
    """``--mps-gpus``: "all" -> None, "none" -> (), "0,2" or UUIDs -> ('0', '2')."""
    word = text.strip().lower()
    if word in ("all", "none"):
        return None if word == "all" else ()
    chosen = tuple(g.strip() for g in text.split(",") if g.strip())
    if not chosen:
        raise GpusError("--mps-gpus takes all, none, or GPU indices/UUIDs such as 0,1")
    return chosen


def gres_gpus(facts: NvmlFacts, mps_choice: Optional[Sequence[str]]) -> Tuple[GresGpu, ...]:
    """Every GPU with what gres.conf needs, in /dev/nvidiaN order (Slurm sorts by file)."""
    out: List[GresGpu] = []
    known = set()
    for g in facts.gpus:
        if g.minor is None:
            why = "; ".join(g.errors) or "no answer"
            raise GpusError(f"GPU {g.gpu_index}: NVML gives no minor number ({why}): cannot "
                            "name its /dev/nvidiaN")
        ids = {str(g.gpu_index), g.uuid or ""}
        known |= ids
        chosen = mps_choice is None or bool(ids & set(mps_choice))
        out.append(GresGpu(g.gpu_index, g.minor, g.name or "unknown", g.uuid or "unknown",
                           chosen and not g.mig_current, bool(g.mig_current)))
    unknown = [c for c in (mps_choice or ()) if c not in known]
    if unknown:
        raise GpusError(f"--mps-gpus names {', '.join(unknown)}, which this node does not "
                        f"have (GPUs: {', '.join(str(g.gpu_index) for g in facts.gpus)})")
    return tuple(sorted(out, key=lambda g: g.minor))
