"""Real-GPU test helpers: a real MPS daemon in a private pipe dir, always quit at the end.

Tests here are marked ``gpu`` and skip unless the real MPS binaries and an NVIDIA GPU
exist. With MPS_HEALTH_GPU_FAKE=1 they run against tests/fakes' fake instead (parts
that need CUDA skip), so they can be exercised on any machine before a GPU run.
Never change the card's settings here (no nvidia-smi -c/-r/-pm, clocks, MIG).
"""

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest
from clirun import mps_health
from mpsdaemon import launch, query, quit_daemon
from nodesite import Site
from paths import FAKE_BIN, FAKES, REPO

USE_FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"


def real_control() -> Optional[str]:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        return None
    with open(path, "rb") as f:
        return path if f.read(4) == b"\x7fELF" else None  # our fake is a script


@functools.cache
def pythonpath() -> str:
    """Where ``mps_health`` imports from in a clean environment (another user, cwd /): ""
    when this Python finds it installed, else a link to this checkout (removed at
    exit) for PYTHONPATH."""
    probe = subprocess.run([sys.executable, "-c", "import mps_health.checks.canary"],
                           cwd="/", capture_output=True, timeout=60)
    if probe.returncode == 0:
        return ""
    tree = Path(tempfile.mkdtemp(prefix="mpsh-import-"))
    atexit.register(shutil.rmtree, tree, True)
    (tree / "mps_health").symlink_to(REPO)  # the checkout root is the package
    os.chmod(tree, 0o755)
    return str(tree)


def have_gpu() -> bool:
    return real_control() is not None and shutil.which("nvidia-smi") is not None


def have_torch_cuda() -> bool:
    if USE_FAKE:
        return False
    r = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def say(*lines: str) -> None:
    """Print for the record (run with -s); docs/gpu-validation.md is made from this."""
    for line in lines:
        print(line, flush=True)


class Mps:
    """One MPS instance (daemon, pipe dir, log dir) under a private temp dir."""

    def __init__(self, site: Site, name: str = "mps", gpu: Optional[str] = None) -> None:
        self.base = site.root
        self.pipe, self.log = site.dirs(name)
        self.gpu = gpu
        self.config = Path(site.config(
            file=f"{name}.yaml", pipe=self.pipe, log=self.log, control={"timeout_s": 2.0},
            # strays judges the whole node, where other tests' daemons may run.
            checks={"disable": ["strays"]},
            # The audit trail of remediate and the health check stays in the site.
            remediation={"audit_log": f"{site.root}/audit.log", "syslog": False}))
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
                        CUDA_MPS_LOG_DIRECTORY=str(self.log))
        if gpu is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = gpu
        if USE_FAKE:
            self.env["PATH"] = os.pathsep.join((str(FAKE_BIN), str(FAKES), self.env["PATH"]))

    @property
    def binary(self) -> str:
        """The control binary on this instance's PATH: the real one, or the fake."""
        found = shutil.which("nvidia-cuda-mps-control", path=self.env["PATH"])
        assert found, "nvidia-cuda-mps-control is not on PATH"
        return found

    def control(self, command: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return query(self.pipe, command, self.binary, timeout=timeout, env=self.env)

    def start(self) -> subprocess.CompletedProcess:
        r = launch(self.pipe, self.log, self.binary, env=self.env)
        for _ in range(300):
            if self.daemon_pid() is not None:
                break
            time.sleep(0.01)
        return r

    def daemon_pid(self) -> Optional[int]:
        try:
            text = (self.pipe / "nvidia-cuda-mps-control.pid").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and Path(f"/proc/{text}").exists() else None

    def check(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return mps_health("check", "--config", str(self.config), *args, env=self.env,
                          timeout=timeout)

    def quit(self) -> None:
        pid = self.daemon_pid()
        if pid is not None:
            quit_daemon(self.pipe, pid, self.binary, command="quit -t 5", env=self.env,
                        grace=0)


def record_proc(pid: int, into: Path) -> None:
    """Copy /proc/PID's stat, status, cmdline, comm (and environ's CUDA_* lines) as fixtures."""
    into.mkdir(parents=True, exist_ok=True)
    for name in ("stat", "status", "cmdline", "comm"):
        (into / name).write_bytes(Path(f"/proc/{pid}/{name}").read_bytes())
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    keep = [e for e in env if e.startswith((b"CUDA_", b"PATH="))]
    (into / "environ").write_bytes(b"\0".join(keep) + b"\0")


def out_dir() -> Path:
    """Where captured files go: $OUT on the device machine, else a temp dir."""
    base = os.environ.get("OUT")
    out = Path(base, "captures") if base else Path(tempfile.mkdtemp(prefix="mpsh-out-"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def env_info() -> Dict[str, str]:
    info = {}
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_mode",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpu"] = r.stdout.strip()
    return info


@pytest.fixture
def mps_site() -> Iterator[Site]:
    """A site for real daemons (not conftest's site: that puts the fakes first on PATH);
    with MPS_HEALTH_GPU_FAKE=1 the fakes' dir comes first in its mps.binary_dirs (where
    mps-health looks: never on PATH)."""
    s = Site.create(prefix="mpsh-", binary_dirs=(str(FAKE_BIN),) if USE_FAKE else ())
    yield s
    s.close()


@pytest.fixture
def mps(mps_site: Site) -> Iterator[Mps]:
    m = Mps(mps_site)
    yield m
    m.quit()


