"""The site's configuration: YAML at /etc/mps-health/config.yaml, validated whole at load.

Each top-level section is declared once, by the module that owns it (``SECTIONS`` below,
``mps_health.config.schema``). Loading a file validates every section, whichever command
runs: a bad or unknown key raises ConfigError, one line naming the file and the key.
With no file the defaults apply and neither PyYAML nor any owner module is imported.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from mps_health.config.inputs import InputError, parse_yaml, read_text
from mps_health.config.schema import (
    Invalid,
    R,
    Record,
    Section,
    abspath,
    command,
    custom,
    flag,
    gpu_ids,
    internal,
    names,
    number,
    octal_mode,
    pathname,
    shown,
    text,
    whole,
)

DEFAULT_PATH = "/etc/mps-health/config.yaml"
LAYOUTS = ("node", "per-gpu", "per-job")

# Default pipe/log paths per layout. {gpu} is a GPU index, {job} a Slurm job id.
DEFAULT_DIRS = {
    "node": ("/tmp/nvidia-mps", "/var/log/nvidia-mps"),
    "per-gpu": ("/tmp/nvidia-mps_{gpu}", "/var/log/nvidia-mps_{gpu}"),
    "per-job": ("/tmp/nvidia-mps_job{job}", "/tmp/nvidia-log_job{job}"),
}
SUN_PATH_MAX = 108  # sockaddr_un.sun_path, NUL included
LONGEST_ENTRY = "control_privileged"  # the longest name the daemon binds in the pipe dir
# The longest values a template field takes: Slurm job ids are 32-bit; Slurm gives GPU
# indices (a UUID in CUDA_VISIBLE_DEVICES is caught when the prolog makes the path).
LONGEST_FIELDS = {"job": "4294967295", "gpu": "99"}

# Sections owned by other modules: name -> the function importing the module whose
# SECTIONS declares it. A file has the owners of the sections it gives imported and all
# their sections validated (absent ones as empty); where one section's rules read another
# (READ_BY), giving slurm validates healthcheck too. Without a file, none is imported (a
# node's file of core keys costs no owner's import). Order matters.
Owner = Callable[[], Sequence["Section[Any]"]]


def _deep_checks() -> Sequence[Section[Any]]:
    from mps_health.config import deep_checks
    return deep_checks.SECTIONS


def _slurm() -> Sequence[Section[Any]]:
    from mps_health.config import slurm
    return slurm.SECTIONS


def _jobs() -> Sequence[Section[Any]]:
    from mps_health.config import jobs
    return jobs.SECTIONS


def _remediation() -> Sequence[Section[Any]]:
    from mps_health.config import remediation
    return remediation.SECTIONS


def _exporter() -> Sequence[Section[Any]]:
    from mps_health.config import exporter
    return exporter.SECTIONS


SECTIONS: Dict[str, Owner] = {
    **dict.fromkeys(("servers", "logs", "canary", "clients"), _deep_checks),
    **dict.fromkeys(("gpu", "slurm", "orphans"), _slurm),
    "jobs": _jobs,
    **dict.fromkeys(("healthcheck", "remediation"), _remediation),
    "exporter": _exporter,
}

READ_BY = {"slurm": ("healthcheck",)}  # section -> those whose rules read it

# Keys that once had a twin: one key per concept now, the old name is refused with a hint.
MOVED = {
    "healthcheck.tag": "slurm.drain_tag",
    "healthcheck.scontrol_timeout_s": "slurm.timeout_s",
    "remediation.orphan_min_age_s": "orphans.min_age_s",
}

DEFAULT_COMMANDS = {name: name for name in ("nvidia-cuda-mps-control", "scontrol", "squeue")}
# Where the MPS binaries are looked for when ``commands`` gives a name: one list for every
# command, never the caller's PATH, so a check and the reset it advises find the same
# binary, in slurmd's empty environment too. runner.SAFE_PATH's dirs in its order, then
# the driver's dir on Kubernetes/NVIDIA container nodes and the CUDA toolkit's (README.md,
# "Where mps-health finds the MPS binaries").
MPS_BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin",
                   "/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin")
# Commands that may be configured but are not looked up on PATH by default. The server
# is the one beside the control binary unless configured (mps_health.remediation.processes).
OPTIONAL_COMMANDS = ("mps-health-canary", "nvidia-cuda-mps-server")


class ConfigError(Exception):
    """A configuration problem, worded as the one line the user sees."""


# --- the core's own sections ------------------------------------------------------------

def _dirs(value: Any) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise Invalid(f"must be a list of absolute dirs, e.g. [/usr/bin] (got {shown(value)})")
    return tuple(dict.fromkeys(abspath(v) for v in value))


class MpsConfig(Record):
    layout: str = text("node", choices=LAYOUTS)
    pipe_dir: str = pathname("/tmp/nvidia-mps")  # default: DEFAULT_DIRS of the layout
    log_dir: str = pathname("/var/log/nvidia-mps")
    gpus: Tuple[str, ...] = custom(("0",), gpu_ids)  # per-gpu: the GPUs that run an instance
    dir_mode: int = custom(0o777, octal_mode)  # pipe dirs: every user's clients connect there
    # Log dirs: only the control daemon writes there, so no one else may (a user's entry
    # there is a link the daemon would append to, or a forged log). Default 0755, per-job 0700.
    log_dir_mode: int = custom(0o755, octal_mode)
    dir_owner: str = text("root")  # user name, uid, or "job" (per-job: the job's user)
    daemon_user: str = text("root")  # "job" for per-job daemons; "any" to not check
    forbid_root_daemon: bool = flag(False)
    # Where the MPS binaries are found unless ``commands`` names them (root's dirs only:
    # whatever is found there runs as root).
    binary_dirs: Tuple[str, ...] = custom(MPS_BINARY_DIRS, _dirs)
    # Per-job: at most this many instances are judged per run (each costs a control client);
    # the rest are named as not judged, never guessed about.
    max_instances: int = whole(256, low=1, high=100000)


def socket_path_bytes(pipe_dir: str) -> int:
    """Bytes of the longest socket path the daemon binds in ``pipe_dir``, NUL included."""
    return len(pipe_dir.encode()) + 1 + len(LONGEST_ENTRY) + 1


def _check_template(key: str, template: str, layout: str) -> None:
    """The pipe/log dir template rules of each layout (every reader relies on them)."""
    if "{" not in template and "}" not in template:  # a plain path: no field to check
        fields: List[str] = []
    else:
        import string  # only for a template: its Template class compiles a regex at import

        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError:
            raise Invalid("has an unbalanced { or }", key) from None
    allowed = {"node": (), "per-gpu": ("gpu",), "per-job": ("job", "gpu")}[layout]
    if any(f not in allowed for f in fields):
        raise Invalid(f"the {layout} layout allows only "
                      f"{', '.join('{' + f + '}' for f in allowed) or 'a plain path'} "
                      f"(got {shown(template)})", key)
    if allowed and allowed[0] not in fields:  # per-gpu: {gpu}, per-job: {job}
        raise Invalid(f"{layout} layout needs {{{allowed[0]}}} in the path", key)
    if layout == "per-job":
        parent = os.path.dirname(template)
        if "{" in parent or "}" in parent:
            raise Invalid("{job} and {gpu} may only appear in the last path component "
                          "(the parent dir is shared by every job)", key)
        if any(c.isspace() for c in template):
            raise Invalid("must not contain white space (TaskProlog exports it)", key)


def _finish_mps(m: MpsConfig, given: Mapping[str, Any], loaded: Mapping[str, Record]
                ) -> MpsConfig:
    per_job = m.layout == "per-job"
    owner = "job" if per_job else "root"
    pipe_dir, log_dir = DEFAULT_DIRS[m.layout]
    defaults = {"pipe_dir": pipe_dir, "log_dir": log_dir, "dir_owner": owner,
                "daemon_user": owner, "log_dir_mode": 0o700 if per_job else 0o755}
    m = m._replace(**{k: v for k, v in defaults.items() if k not in given})  # by the layout
    if m.log_dir_mode & 0o700 != 0o700:
        raise Invalid(f"must let the daemon's user read, write and enter the dir (0700 at "
                      f"least; got {m.log_dir_mode:04o})", "log_dir_mode")
    _check_template("pipe_dir", m.pipe_dir, m.layout)
    _check_template("log_dir", m.log_dir, m.layout)
    if per_job and "{gpu}" in m.pipe_dir and "{gpu}" not in m.log_dir:
        raise Invalid("needs {gpu} too when mps.pipe_dir has it (one daemon per GPU, each "
                      "with its own control.log)", "log_dir")
    # Per-job: the prologs make each pipe dir, and must never meet one too long for the
    # daemon's socket. A fixed dir too long is the directories check's pipe-path-too-long.
    longest = socket_path_bytes(m.pipe_dir.format(**LONGEST_FIELDS))
    if per_job and longest > SUN_PATH_MAX:
        raise Invalid(f"too long for a unix socket path ({longest} bytes with the largest "
                      f"field values and '/{LONGEST_ENTRY}', limit {SUN_PATH_MAX})", "pipe_dir")
    return m


class ControlConfig(Record):
    timeout_s: float = number(2.0, low=0.1, high=60.0)
    max_clients: int = whole(16, low=1, high=1024)  # control clients running at once
    warn_latency_s: float = number(0.5, low=0.0)
    expected_thread_percentage: Optional[float] = number(None, 0.0, 100.0, optional=True)


class TmpfilesConfig(Record):
    require_guard: bool = flag(False)  # warn even where /tmp is not aged by systemd-tmpfiles


def _modules(value: Any) -> Tuple[str, ...]:
    mods = names(value)
    for m in mods:
        if not all(part.isidentifier() for part in m.split(".")):
            raise Invalid(f"must be Python module names, e.g. site_checks.gpu_temp "
                          f"(got {shown(m)})")
    return mods


class ChecksConfig(Record):
    only: Tuple[str, ...] = custom((), names)  # exactly these (empty: the defaults)
    enable: Tuple[str, ...] = custom((), names)  # besides the defaults (e.g. canary)
    disable: Tuple[str, ...] = custom((), names)
    modules: Tuple[str, ...] = custom((), _modules)  # the site's own check modules
    # Reported and exported like the others, but never a reason for the health check to
    # drain: for rolling out a new or changed check safely.
    observe: Tuple[str, ...] = custom((), names)


class CheckTable(Protocol):
    """What judging a ``checks`` section needs of the run's check table. The engine owns
    it, a layer above config, so the commands hand ``mps_health.engine.registry`` in."""

    SITE_SECTIONS: Dict[str, Section[Any]]  # section name -> as a site module declares it

    def load_site_module(self, module: str) -> None: ...

    def checks(self) -> Mapping[str, Any]: ...


def _site_sections(c: ChecksConfig, table: Optional[CheckTable]) -> Dict[str, Section[Any]]:
    """Import the site's check modules (``modules``) and judge every check name against
    ``table``; the sections those modules declare. Without a table (a caller that runs no
    check) nothing is imported or judged."""
    lists = ("only", "enable", "disable", "observe")
    if table is None or (not c.modules and not any(getattr(c, key) for key in lists)):
        return {}
    for module in c.modules:
        table.load_site_module(module)  # Invalid names the module
    known = table.checks()
    for key in lists:
        for name in getattr(c, key):
            if name not in known:
                raise Invalid(f"unknown check {shown(name)} (known: "
                              f"{', '.join(sorted(known))})", key)
    return dict(table.SITE_SECTIONS)


MPS = Section("mps", MpsConfig, _finish_mps)
CONTROL = Section("control", ControlConfig)
TMPFILES = Section("tmpfiles", TmpfilesConfig)
CHECKS = Section("checks", ChecksConfig)
CORE_SECTIONS = (CHECKS, MPS, CONTROL, TMPFILES)  # checks first: it may add site sections


def _commands(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise Invalid("must be a mapping of program name to path")
    known = (*DEFAULT_COMMANDS, *OPTIONAL_COMMANDS)
    for name, where in value.items():
        if name not in known:
            raise Invalid(f"unknown program (known here: {', '.join(known)})", str(name))
        try:
            command(where)
        except Invalid as e:
            raise Invalid(e.why, str(name)) from None
    return {**DEFAULT_COMMANDS, **value}


class Config(Record):
    """The whole file, valid. Other modules' sections: ``config.get(THEIR_SECTION)``."""

    path: Optional[str] = internal(None)  # the file it came from; None: built-in defaults
    node_name: Optional[str] = text(None, optional=True)
    budget_s: float = number(15.0, low=1.0, high=300.0)
    state_dir: str = pathname("/var/lib/mps-health")
    run_dir: str = pathname("/run/mps-health")
    commands: Mapping[str, str] = custom(DEFAULT_COMMANDS, _commands)
    checks: ChecksConfig = internal(ChecksConfig())
    mps: MpsConfig = internal(MpsConfig())
    control: ControlConfig = internal(ControlConfig())
    tmpfiles: TmpfilesConfig = internal(TmpfilesConfig())
    sections: Mapping[str, Record] = internal({})
    given: Tuple[str, ...] = internal(())  # sections in the file
    raw: Mapping[str, Any] = internal({})  # as parsed (snapshots)

    def command(self, name: str) -> str:
        """The configured path or name of an external command (default: its name; the MPS
        binaries' names are found in ``mps.binary_dirs``: process_identity.locate)."""
        return self.commands.get(name, name)

    def get(self, section: Section[R]) -> R:
        """The validated record of ``section`` (its defaults when the file has none)."""
        found = self.sections.get(section.name)
        return found if isinstance(found, section.record) else section.record()


TOP_KEYS = ("node_name", "budget_s", "state_dir", "run_dir", "commands")
MAX_BYTES = 1 << 20  # a config is a few KiB; a larger file is refused, never cut


def load(path: Optional[str] = None, text: Optional[str] = None, *,
         table: Optional[CheckTable]) -> Config:
    """The config from ``path`` (else the default file, if it exists) or from ``text``;
    ``table`` is required so that no command skips judging the check names by leaving it
    out (None: a caller that runs no check, ``_site_sections``). A
    symlink is followed (the path is the admin's choice); anything but a regular file is
    refused without blocking, and so is one over MAX_BYTES or past ``inputs.parse_yaml``'s
    bounds (nesting past ``inputs.MAX_DEPTH``, aliases past ``inputs.MAX_VALUES`` values)."""
    explicit = path is not None
    path = path or DEFAULT_PATH
    try:
        if text is None:
            text = read_text(path, MAX_BYTES, follow=True)
            if text is None:
                if explicit:
                    raise ConfigError(f"{path}: no such file; give an existing --config")
                return Config()  # no file: the defaults, and nothing else imported
        data = parse_yaml(text)
    except InputError as e:
        raise ConfigError(f"{path}: {e}") from None
    if not isinstance(data, (dict, type(None))):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return from_mapping(data or {}, path, table)


def from_mapping(data: Mapping[str, Any], path: Optional[str],
                 table: Optional[CheckTable] = None) -> Config:
    """Validate every key of ``data``; ConfigError names the first bad one. ``table``: the
    check table the ``checks`` section is judged against (``_site_sections``)."""
    where = path or "<defaults>"
    key = ""
    try:
        top: Dict[str, Any] = {}
        for key in TOP_KEYS:
            if key in data:
                top[key] = Config._specs[key].parse(data[key])
        loaded: Dict[str, Record] = {}
        key = CHECKS.name  # first: its site modules may add sections
        checks = loaded[key] = CHECKS.validate(_mapping(data.get(key)), loaded)
        site = _site_sections(checks, table)
        for section in CORE_SECTIONS[1:]:
            key = section.name
            loaded[key] = section.validate(_mapping(data.get(key)), loaded)
        known = (*TOP_KEYS, *loaded, *SECTIONS, *site)
        for key in data:
            if key not in known:
                raise Invalid(f"unknown section (known: {', '.join(sorted(known))})")
        wanted = set(data)
        wanted.update(r for k in data for r in READ_BY.get(str(k), ()))
        owners: Dict[str, Section] = {}
        for owner in dict.fromkeys(o for k, o in SECTIONS.items() if k in wanted):
            owners.update((s.name, s) for s in owner())
        owners.update(site)
        for key, section in owners.items():  # absent ones too: rules across sections
            loaded[key] = section.validate(_mapping(data.get(key)), loaded)
    except Invalid as e:
        name = str(key) + (f".{e.key}" if e.key else "")
        why = f"unknown key: it is {MOVED[name]} now" if name in MOVED else e.why
        raise ConfigError(f"{where}: key {shown(name)}: {why}") from None
    core = {s.name: loaded.pop(s.name) for s in CORE_SECTIONS}
    return Config(path=path, **top, **core, sections=loaded,
                  given=tuple(str(k) for k in data), raw=dict(data))


def _mapping(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Invalid("must be a mapping of keys")
    return value


def mps_gpu_ids(config: Config) -> Optional[Tuple[str, ...]]:
    """The GPUs (indices or UUIDs) MPS serves: ``gpu.mps_gpus``, else the per-gpu layout's
    ``mps.gpus``, else None for every GPU (a node-wide or per-job daemon serves any)."""
    from mps_health.config.slurm import gpu_settings  # the gpu section's owner

    chosen = gpu_settings(config).mps_gpus
    if chosen is None and config.mps.layout == "per-gpu":
        return config.mps.gpus
    return chosen
