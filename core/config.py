"""The site's configuration: YAML at /etc/mps-health/config.yaml, checked key by key.

With no file, the seeds' defaults apply (one node-wide daemon on /tmp/nvidia-mps,
logs in /var/log/nvidia-mps, mode 0777) and PyYAML is never imported. A bad file
raises ConfigError with one line naming the file, the key and what is wrong.
"""

import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

DEFAULT_PATH = "/etc/mps-health/config.yaml"
LAYOUTS = ("node", "per-gpu", "per-job")

# Default pipe/log paths per layout. {gpu} is a GPU index, {job} a Slurm job id.
DEFAULT_DIRS = {
    "node": ("/tmp/nvidia-mps", "/var/log/nvidia-mps"),
    "per-gpu": ("/tmp/nvidia-mps_{gpu}", "/var/log/nvidia-mps_{gpu}"),
    "per-job": ("/tmp/nvidia-mps_job{job}", "/tmp/nvidia-log_job{job}"),
}


class ConfigError(Exception):
    """A configuration problem, worded as the one line the user sees."""


class MpsConfig(NamedTuple):
    layout: str = "node"
    pipe_dir: str = "/tmp/nvidia-mps"
    log_dir: str = "/var/log/nvidia-mps"
    gpus: Tuple[str, ...] = ("0",)  # per-gpu: the GPUs that run an instance
    dir_mode: int = 0o777
    dir_owner: str = "root"  # user name, uid, or "job" (per-job: the job's user)
    daemon_user: str = "root"  # "job" for per-job daemons; "any" to not check
    forbid_root_daemon: bool = False


class ControlConfig(NamedTuple):
    timeout_s: float = 2.0
    warn_latency_s: float = 0.5
    expected_thread_percentage: Optional[float] = None


class TmpfilesConfig(NamedTuple):
    require_guard: bool = False  # warn even where /tmp is not aged by systemd-tmpfiles


class Config(NamedTuple):
    path: Optional[str]  # the file it came from; None for built-in defaults
    node_name: Optional[str] = None
    budget_s: float = 15.0
    state_dir: str = "/var/lib/mps-health"
    run_dir: str = "/run/mps-health"
    commands: Mapping[str, str] = {}
    only: Tuple[str, ...] = ()  # exactly these checks (empty: the defaults, see engine)
    enable: Tuple[str, ...] = ()  # checks to run besides the defaults (e.g. canary)
    disable: Tuple[str, ...] = ()
    mps: MpsConfig = MpsConfig()
    control: ControlConfig = ControlConfig()
    tmpfiles: TmpfilesConfig = TmpfilesConfig()
    raw: Mapping[str, Any] = {}  # the parsed file, for sections owned by other modules

    def command(self, name: str) -> str:
        """The configured path of an external command (default: its name, found on PATH)."""
        return self.commands.get(name, name)

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.raw.get(name) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{self.path}: key '{name}': must be a mapping")
        return value


DEFAULT_COMMANDS = {
    "nvidia-cuda-mps-control": "nvidia-cuda-mps-control",
    "scontrol": "scontrol",
    "squeue": "squeue",
}

_TOP_KEYS = {
    "node_name", "budget_s", "state_dir", "run_dir", "commands", "checks", "mps",
    "control", "tmpfiles",
    # Sections read by other modules (gpu checks, slurm, exporters, remediation):
    "gpu", "slurm", "healthcheck", "exporter", "remediation", "nagios", "orphans",
    "servers", "logs", "canary",  # the deep checks (checks/servers.py, logs.py, canary.py)
    "jobs",  # per-job MPS hooks (mps_health.slurm.settings)
    "clients",  # who MPS serves (checks/clients.py)
}


def load(path: Optional[str] = None, text: Optional[str] = None) -> Config:
    """Load the config from ``path`` (default file if it exists) or from ``text``."""
    explicit = path is not None
    path = path or DEFAULT_PATH
    if text is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if explicit:
                raise ConfigError(f"{path}: no such file; give an existing --config") from None
            return from_mapping({}, None)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    import yaml  # only when there is a file: PyYAML costs milliseconds

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return from_mapping(data, path)


def from_mapping(data: Mapping[str, Any], path: Optional[str]) -> Config:
    v = _Validator(path or "<defaults>")
    v.known(data, _TOP_KEYS, "")
    mps = _mps(v, v.mapping(data, "mps"))
    control = v.mapping(data, "control")
    v.known(control, {"timeout_s", "warn_latency_s", "expected_thread_percentage"}, "control")
    tmpf = v.mapping(data, "tmpfiles")
    v.known(tmpf, {"require_guard"}, "tmpfiles")
    checks = v.mapping(data, "checks")
    v.known(checks, {"only", "enable", "disable"}, "checks")
    commands = v.mapping(data, "commands")
    for name, value in commands.items():
        if not isinstance(value, str) or not value:
            v.fail(f"commands.{name}", "must be a command name or path")
    budget = v.number(data, "budget_s", 15.0, "", low=1.0, high=300.0)
    return Config(
        path=path,
        node_name=v.string(data, "node_name", None, ""),
        budget_s=budget,
        state_dir=v.abspath(data, "state_dir", "/var/lib/mps-health", ""),
        run_dir=v.abspath(data, "run_dir", "/run/mps-health", ""),
        commands={**DEFAULT_COMMANDS, **commands},
        only=v.names(checks, "only", "checks"),
        enable=v.names(checks, "enable", "checks"),
        disable=v.names(checks, "disable", "checks"),
        mps=mps,
        control=ControlConfig(
            timeout_s=v.number(control, "timeout_s", 2.0, "control", low=0.1, high=60.0),
            warn_latency_s=v.number(control, "warn_latency_s", 0.5, "control", low=0.0),
            expected_thread_percentage=v.optional_number(
                control, "expected_thread_percentage", "control", low=0.0, high=100.0
            ),
        ),
        tmpfiles=TmpfilesConfig(require_guard=v.boolean(tmpf, "require_guard", False, "tmpfiles")),
        raw=dict(data),
    )


def _mps(v: "_Validator", m: Mapping[str, Any]) -> MpsConfig:
    v.known(
        m,
        {"layout", "pipe_dir", "log_dir", "gpus", "dir_mode", "dir_owner", "daemon_user",
         "forbid_root_daemon"},
        "mps",
    )
    layout = v.string(m, "layout", "node", "mps")
    if layout not in LAYOUTS:
        v.fail("mps.layout", f"must be one of {', '.join(LAYOUTS)} (got {layout!r})")
    pipe_default, log_default = DEFAULT_DIRS[str(layout)]
    pipe = v.abspath(m, "pipe_dir", pipe_default, "mps")
    log = v.abspath(m, "log_dir", log_default, "mps")
    for key, value in (("pipe_dir", pipe), ("log_dir", log)):
        if layout == "per-job" and "{job}" not in value:
            v.fail(f"mps.{key}", "per-job layout needs {job} in the path")
        if layout == "per-gpu" and "{gpu}" not in value:
            v.fail(f"mps.{key}", "per-gpu layout needs {gpu} in the path")
        if layout == "node" and ("{" in value or "}" in value):
            v.fail(f"mps.{key}", "node layout takes a plain path, without {...}")
    gpus_raw = m.get("gpus", [0])
    if isinstance(gpus_raw, (int, str)) and not isinstance(gpus_raw, bool):
        gpus_raw = [gpus_raw]
    if not isinstance(gpus_raw, list) or not all(
        isinstance(g, (int, str)) and not isinstance(g, bool) and str(g).strip()
        for g in gpus_raw
    ):
        v.fail("mps.gpus", "must be a list of GPU indices or UUIDs, e.g. [0, 1]")
    mode_raw = m.get("dir_mode", "0777")
    try:
        mode = int(mode_raw, 8) if isinstance(mode_raw, str) else int(mode_raw)
    except (TypeError, ValueError):
        mode = -1
    if isinstance(mode_raw, bool) or not 0 <= mode <= 0o7777:
        v.fail("mps.dir_mode", f"must be an octal mode as a string, e.g. '0777' (got {mode_raw!r})")
    return MpsConfig(
        layout=str(layout),
        pipe_dir=pipe,
        log_dir=log,
        gpus=tuple(str(g).strip() for g in gpus_raw),
        dir_mode=mode,
        dir_owner=str(v.string(m, "dir_owner", "job" if layout == "per-job" else "root", "mps")),
        daemon_user=str(
            v.string(m, "daemon_user", "job" if layout == "per-job" else "root", "mps")
        ),
        forbid_root_daemon=v.boolean(m, "forbid_root_daemon", False, "mps"),
    )


class _Validator:
    """Typed reads of one mapping, failing with 'FILE: key 'a.b': what is wrong'."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, why: str) -> None:
        raise ConfigError(f"{self.path}: key '{key}': {why}")

    @staticmethod
    def _key(prefix: str, key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    def known(self, m: Mapping[str, Any], keys: set, prefix: str) -> None:
        for key in m:
            if key not in keys:
                where = self._key(prefix, str(key))
                self.fail(where, f"unknown key (known here: {', '.join(sorted(keys))})")

    def mapping(self, m: Mapping[str, Any], key: str) -> Dict[str, Any]:
        value = m.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(key, "must be a mapping of keys")
        return dict(value)

    def string(self, m: Mapping[str, Any], key: str, default: Any, prefix: str) -> Any:
        value = m.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(self._key(prefix, key), f"must be a non-empty string (got {value!r})")
        return value

    def abspath(self, m: Mapping[str, Any], key: str, default: str, prefix: str) -> str:
        value = self.string(m, key, default, prefix)
        if not value.startswith("/") or "\0" in value:
            self.fail(self._key(prefix, key), f"must be an absolute path (got {value!r})")
        return os.path.normpath(value)

    def number(self, m: Mapping[str, Any], key: str, default: float, prefix: str,
               low: float = 0.0, high: float = float("inf")) -> float:
        value = m.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(self._key(prefix, key), f"must be a number (got {value!r})")
        if not low <= value <= high:
            self.fail(self._key(prefix, key), f"must be between {low:g} and {high:g} (got {value})")
        return float(value)

    def optional_number(self, m: Mapping[str, Any], key: str, prefix: str,
                        low: float, high: float) -> Optional[float]:
        if m.get(key) is None:
            return None
        return self.number(m, key, 0.0, prefix, low, high)

    def boolean(self, m: Mapping[str, Any], key: str, default: bool, prefix: str) -> bool:
        value = m.get(key, default)
        if not isinstance(value, bool):
            self.fail(self._key(prefix, key), f"must be true or false (got {value!r})")
        return bool(value)

    def names(self, m: Mapping[str, Any], key: str, prefix: str) -> Tuple[str, ...]:
        value = m.get(key) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            self.fail(self._key(prefix, key), "must be a list of check names")
        out: List[str] = list(value)
        return tuple(out)
