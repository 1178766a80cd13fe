"""One node's site for a test: a private root with the config file, the MPS pipe and log
dirs, the run and state dirs, and the daemons started there. Every test builds its node
here (the ``site`` fixture in conftest.py gives one, closed afterwards).

The root is a fresh dir under /tmp that other users may enter (0755; pytest's tmp_path is
0700), so a daemon or hook run as a test user reaches it, and its paths stay short (a
socket path holds 108 bytes). ``config()`` writes YAML made from a dict: the node-wide
layout on this site's dirs, merged section by section with what the test gives. Daemons
start and answer through tests/helpers/mpsdaemon.py. Closing ends, by PID, every process whose
CUDA_MPS_PIPE_DIRECTORY lies in the root (daemons, servers and clients, ours or a test
user's), then removes the root.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import mpsdaemon
from paths import FAKE_CONTROL

Config = Dict[str, Any]
QUIET_LATENCY_S = 60.0  # control.warn_latency_s of a test's site: beyond control.timeout_s


def merged(base: Mapping[str, Any], more: Mapping[str, Any]) -> Config:
    """``base`` with ``more`` laid over it, section by section; a None value drops the key."""
    out = dict(base)
    for key, value in more.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def canary_off_unless_named(data: Config) -> Config:
    """``data`` with the canary disabled where a slurm: section turns it on by default and
    the config does not name it (no canary: section, not in checks.only or enable): a test
    not about the canary keeps what it saw before (this machine has no libcuda)."""
    if "slurm" not in data or "canary" in data:
        return data
    checks = dict(data.get("checks") or {})
    named = set()
    for key in ("only", "enable", "disable"):
        value = checks.get(key) or ()
        named |= set(value.split(",") if isinstance(value, str) else value)
    if "canary" in named:
        return data
    disable = checks.get("disable") or []
    checks["disable"] = [*(disable.split(",") if isinstance(disable, str) else disable),
                         "canary"]
    return {**data, "checks": checks}


def strays_off_unless_private(data: Config) -> Config:
    """``data`` with the strays check disabled, unless the config names it (checks.only,
    enable or disable) or the test runs in its own PID namespace (tests/helpers/privatepids.py):
    strays judges every MPS process of the machine, and other test runs' fakes and test
    users' impostors would be judged with this test's. A test about strays is marked
    private_pids."""
    import privatepids

    checks = dict(data.get("checks") or {})
    named = set()
    for key in ("only", "enable", "disable"):
        value = checks.get(key) or ()
        named |= set(value.split(",") if isinstance(value, str) else value)
    if privatepids.INSIDE or "strays" in named:
        return data
    disable = checks.get("disable") or []
    checks["disable"] = [*(disable.split(",") if isinstance(disable, str) else disable),
                         "strays"]
    return {**data, "checks": checks}


@dataclass
class Daemon:
    """A control daemon this site started, serving ``pipe_dir``."""

    pipe_dir: Path
    log_dir: Path
    env: Dict[str, str]
    control: str = FAKE_CONTROL
    pid: Optional[int] = None

    def start(self) -> "Daemon":
        """Start it on its dirs (again, after a quit); its PID is the new one's."""
        self.pid = mpsdaemon.start_daemon(self.pipe_dir, self.log_dir, self.control,
                                          env=self.env)
        return self

    def query(self, command: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
        return mpsdaemon.query(self.pipe_dir, command, self.control, timeout=timeout)

    def signal(self, sig: int) -> None:
        """Send ``sig``; SIGSTOP returns once the daemon is stopped (mpsdaemon.stop_process),
        SIGKILL once it is dead (remhelp.kill_and_wait): the kernel acts on a signal only
        when the process next runs, which a loaded machine delays."""
        assert self.pid is not None
        if sig == signal.SIGSTOP:
            mpsdaemon.stop_process(self.pid)
        elif sig == signal.SIGKILL:
            from remhelp import kill_and_wait  # (remhelp imports this module)

            kill_and_wait(self.pid)
        else:
            os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.pid is not None:
            mpsdaemon.kill_daemon(self.pid)
            self.pid = None


@dataclass
class Site:
    """A node under ``root``; ``control`` is the control binary its daemons run (the fake
    unless a test gives a real one)."""

    root: Path
    control: str = FAKE_CONTROL
    daemons: List[Daemon] = field(default_factory=list)
    # Dirs put before the system's in the config's mps.binary_dirs (mps-health never
    # looks on PATH): conftest's ``site`` gives the fakes' dir; a GPU site none, so the
    # real binaries are found where the system has them.
    binary_dirs: Tuple[str, ...] = ()

    @classmethod
    def create(cls, prefix: str = "mpsh-site-", **kwargs: Any) -> "Site":
        root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        root.chmod(0o755)
        return cls(root, **kwargs)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def pipe(self) -> Path:
        """Instance "mps"'s pipe dir (made by dirs() or start_daemon())."""
        return self.root / "mps-pipe"

    @property
    def log(self) -> Path:
        return self.root / "mps-log"

    def dirs(self, name: str = "mps", mode: int = 0o777, log_mode: int = 0o755
             ) -> Tuple[Path, Path]:
        """The pipe and log dir of instance ``name``: the pipe dir ``mode`` (mps.dir_mode's
        default), the log dir ``log_mode`` (mps.log_dir_mode's)."""
        pipe, log = self.root / f"{name}-pipe", self.root / f"{name}-log"
        for d, m in ((pipe, mode), (log, log_mode)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(m)
        return pipe, log

    def start_daemon(self, name: str = "mps", **env: str) -> Daemon:
        """A control daemon for instance ``name``, with ``env`` added to this environment;
        killed by its PID at close."""
        pipe, log = self.dirs(name)
        d = Daemon(pipe, log, env, self.control)
        self.daemons.append(d)
        return d.start()

    def sticky_tmp(self, name: str = "tmp") -> Path:
        """A dir in the root standing in for /tmp: sticky, everyone may create in it."""
        d = self.root / name
        d.mkdir(exist_ok=True)
        d.chmod(0o1777)
        return d

    def per_job(self, **mps: Any) -> Config:
        """The ``mps`` section of the per-job layout in sticky_tmp(), as the Prolog makes
        it (dirs 0700, named by job), with ``mps`` merged over it; for config()."""
        parent = self.sticky_tmp()
        return {"mps": {"layout": "per-job", "pipe_dir": f"{parent}/nvidia-mps_job{{job}}",
                        "log_dir": f"{parent}/nvidia-log_job{{job}}", "dir_mode": "0700", **mps}}

    def squeue(self, *lines: str) -> str:
        """A squeue in the root printing ``lines`` (made by hostile.squeue_line): the jobs
        Slurm runs on this node. Returns its path, for the config's ``commands:``."""
        from hostile import fake_squeue

        return fake_squeue(self.root, lines)

    def config_dict(self, extra: Mapping[str, Any] = {}, *, pipe: Union[Path, str, None] = None,
                    log: Union[Path, str, None] = None) -> Config:
        """One node-wide instance on ``pipe``/``log`` (instance "mps"'s dirs unless given),
        this site's run and state dirs, its ``binary_dirs`` first in ``mps.binary_dirs``,
        no boot grace, and ``extra`` merged over it (the canary off where ``slurm`` turns
        it on and the config does not name it: canary_off_unless_named; strays off where
        other test runs could be seen: strays_off_unless_private)."""
        return strays_off_unless_private(canary_off_unless_named(
            merged(self._layout(pipe, log), extra)))

    def _layout(self, pipe: Union[Path, str, None], log: Union[Path, str, None]) -> Config:
        from mps_health.config.load import MPS_BINARY_DIRS

        base: Config = {
            "run_dir": str(self.run_dir), "state_dir": str(self.state_dir),
            "mps": {"pipe_dir": str(pipe or self.pipe), "log_dir": str(log or self.log)},
            # A machine booted minutes ago (a fresh GPU node, a CI machine) must not excuse
            # the faults tests make: the boot grace is tested where a test asks for it.
            "healthcheck": {"boot_grace_s": 0},
            # How fast a fake daemon answers is the machine's load, not MPS's health: no
            # slow-answer warning (nor check_mps' -w/-c, taken from it) where a test does
            # not ask for one. A test about it sets it, or gives -w/-c.
            "control": {"warn_latency_s": QUIET_LATENCY_S}}
        if self.binary_dirs:
            base["mps"]["binary_dirs"] = [*self.binary_dirs, *MPS_BINARY_DIRS]
        return base

    def config(self, *extras: Union[str, Mapping[str, Any]], file: str = "config.yaml",
               pipe: Union[Path, str, None] = None, log: Union[Path, str, None] = None,
               **sections: Any) -> str:
        """Write the config (see config_dict) to ``file`` in the root; returns its path.
        Each of ``extras`` is YAML text or a dict, merged in order; ``sections`` are
        top-level keys, merged last."""
        import yaml

        data = self._layout(pipe, log)
        for extra in (*extras, sections):
            data = merged(data, yaml.safe_load(extra) or {} if isinstance(extra, str) else extra)
        data = strays_off_unless_private(canary_off_unless_named(data))
        return self.write(file, yaml.safe_dump(data, sort_keys=False))

    def write(self, name: str, text: str, mode: int = 0o644) -> str:
        """A file in the root with ``text`` as it is (a config a test writes by hand)."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return str(path)

    def processes(self) -> List[int]:
        """Live PIDs whose CUDA_MPS_PIPE_DIRECTORY lies in this root."""
        marker = f"={self.root}/".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X") and any(
                    e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=") and marker in e for e in env):
                found.append(int(name))
        return sorted(found)

    def close(self) -> None:
        for d in self.daemons:
            d.stop()
        for pid in self.processes():  # each found by its environment just now
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)

