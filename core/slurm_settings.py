"""The ``slurm``, ``orphans`` and ``gpu`` config sections, checked key by key.

Each reader returns a NamedTuple of settings or raises ConfigError with the core's
one-line style ("FILE: key 'slurm.timeout_s': what is wrong"). Checks call them and
turn a ConfigError into one UNKNOWN ``config-invalid`` line.
"""

from typing import Any, Mapping, NamedTuple, Optional, Tuple

from .config import Config, ConfigError

OUTPUTS = ("auto", "text", "json")
MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "any")


class SlurmSettings(NamedTuple):
    timeout_s: float = 5.0  # scontrol/squeue: slurmctld down means UNKNOWN after this
    output: str = "auto"  # "json" from Slurm 23.02 on; "auto" asks scontrol --version once
    gres_conf: Optional[str] = None  # default: beside slurm.conf
    mps_per_gpu: int = 100  # gres.conf Count of mps per GPU
    drain_tag: str = "MPS-HC:"  # a reason starting with this is our own drain
    job_grace_s: float = 60.0  # a new job's prolog has this long to start its MPS daemon


class OrphanSettings(NamedTuple):
    min_age_s: float = 120.0  # younger job dirs are not judged (a job may be starting)


class GpuSettings(NamedTuple):
    mps_gpus: Optional[Tuple[str, ...]] = None  # None: derive from the mps section
    mode_mps: str = "EXCLUSIVE_PROCESS"
    mode_other: str = "DEFAULT"
    modes: Tuple[Tuple[str, str], ...] = ()  # (GPU index or UUID, mode) overrides
    gpu_count: Optional[int] = None  # GPUs this node must have (gres-drift)


def _where(config: Config) -> str:
    return config.path or "<defaults>"


def _section(config: Config, name: str, known: Tuple[str, ...]) -> Mapping[str, Any]:
    data = config.section(name)
    for key in data:
        if key not in known:
            raise ConfigError(f"{_where(config)}: key '{name}.{key}': unknown key "
                              f"(known here: {', '.join(sorted(known))})")
    return data


def _number(config: Config, data: Mapping[str, Any], section: str, key: str, default: float,
            low: float, high: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:
        raise ConfigError(f"{_where(config)}: key '{section}.{key}': must be a number "
                          f"between {low:g} and {high:g} (got {value!r})")
    return float(value)


def _string(config: Config, data: Mapping[str, Any], section: str, key: str,
            default: Optional[str]) -> Optional[str]:
    value = data.get(key, default)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{_where(config)}: key '{section}.{key}': must be a non-empty "
                          f"string (got {value!r})")
    return value


def settings(config: Config) -> SlurmSettings:
    d = _section(config, "slurm", SlurmSettings._fields)
    output = _string(config, d, "slurm", "output", "auto")
    if output not in OUTPUTS:
        raise ConfigError(f"{_where(config)}: key 'slurm.output': must be one of "
                          f"{', '.join(OUTPUTS)} (got {output!r})")
    gres = _string(config, d, "slurm", "gres_conf", None)
    if gres is not None and not gres.startswith("/"):
        raise ConfigError(f"{_where(config)}: key 'slurm.gres_conf': must be an absolute "
                          f"path (got {gres!r})")
    return SlurmSettings(
        timeout_s=_number(config, d, "slurm", "timeout_s", 5.0, 0.1, 60.0),
        output=str(output),
        gres_conf=gres,
        mps_per_gpu=int(_number(config, d, "slurm", "mps_per_gpu", 100, 1, 1_000_000)),
        drain_tag=str(_string(config, d, "slurm", "drain_tag", "MPS-HC:")),
        job_grace_s=_number(config, d, "slurm", "job_grace_s", 60.0, 0.0, 86400.0),
    )


def orphan_settings(config: Config) -> OrphanSettings:
    d = _section(config, "orphans", OrphanSettings._fields)
    return OrphanSettings(_number(config, d, "orphans", "min_age_s", 120.0, 0.0, 30 * 86400.0))


def _gpu_list(config: Config, value: Any, key: str) -> Tuple[str, ...]:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(
            isinstance(g, (int, str)) and not isinstance(g, bool) and str(g).strip()
            for g in value):
        raise ConfigError(f"{_where(config)}: key '{key}': must be a list of GPU indices "
                          "or UUIDs, e.g. [0, 1]")
    return tuple(str(g).strip() for g in value)


def _mode(config: Config, value: Any, key: str) -> str:
    if not isinstance(value, str) or value.upper() not in {m.upper() for m in MODES}:
        raise ConfigError(f"{_where(config)}: key '{key}': must be one of "
                          f"{', '.join(MODES)} (got {value!r})")
    return "any" if value.lower() == "any" else value.upper()


def gpu_settings(config: Config) -> GpuSettings:
    d = _section(config, "gpu", ("mps_gpus", "compute_mode", "count"))
    mps_gpus = None if d.get("mps_gpus") in (None, "all") else \
        _gpu_list(config, d["mps_gpus"], "gpu.mps_gpus")
    modes = d.get("compute_mode") or {}
    if isinstance(modes, str):
        modes = {"mps": modes}
    if not isinstance(modes, dict):
        raise ConfigError(f"{_where(config)}: key 'gpu.compute_mode': must be a mapping of "
                          "mps/other/GPU index or UUID to a mode")
    overrides = tuple((str(k).strip(), _mode(config, v, f"gpu.compute_mode.{k}"))
                      for k, v in modes.items() if str(k) not in ("mps", "other"))
    count = d.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 0):
        raise ConfigError(f"{_where(config)}: key 'gpu.count': must be a whole number "
                          f"(got {count!r})")
    return GpuSettings(
        mps_gpus=mps_gpus,
        mode_mps=_mode(config, modes.get("mps", "EXCLUSIVE_PROCESS"), "gpu.compute_mode.mps"),
        mode_other=_mode(config, modes.get("other", "DEFAULT"), "gpu.compute_mode.other"),
        modes=overrides,
        gpu_count=count,
    )


def mps_gpu_ids(config: Config) -> Optional[Tuple[str, ...]]:
    """The GPUs (indices or UUIDs) MPS serves; None for "every GPU of the node".

    ``gpu.mps_gpus`` wins; else the per-gpu layout's ``mps.gpus``; else every GPU
    (a node-wide daemon serves all GPUs it can see; per-job daemons any GPU a job gets).
    """
    chosen = gpu_settings(config).mps_gpus
    if chosen is not None:
        return chosen
    if config.mps.layout == "per-gpu":
        return config.mps.gpus
    return None
