"""Shared fixtures: the fake MPS control binary on PATH, fake daemons, config files."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

# Tests live in folders by kind (unit, e2e, real, fleet, gpu); the shared helper modules
# beside this file are imported by plain name from all of them.
for _path in (Path(__file__).resolve().parent, Path(__file__).resolve().parent / "gpu"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# The real Slurm cluster (tests/slurm_fixture.py) and the real-GPU fixtures (tests/gpu).
pytest_plugins = ["slurm_fixture", "mpsgpu"]

import mpsdaemon  # noqa: E402  (found through the path set above)
from paths import FAKE_BIN, FAKE_CONTROL, FAKE_SERVER, FAKES, FIXTURES, REPO, TESTS  # noqa: E402, F401

# Tripwire: no test may touch the host's real state (tests/tripwire/hostpaths.py). This
# process is watched by an audit hook, every Python program it starts by sitecustomize.
TRIPWIRE_DIR = Path(__file__).parent / "tripwire"
sys.path.insert(0, str(TRIPWIRE_DIR))
import hostpaths  # noqa: E402

_TOUCHED: List[str] = []
hostpaths.install(lambda event, path: _TOUCHED.append(f"{event} {path}"))
_TRIPWIRE_LOG = Path(f"/tmp/mps-health-tripwire-{os.getpid()}.log")
os.environ["MPS_HEALTH_TEST_TRIPWIRE"] = str(_TRIPWIRE_LOG)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TRIPWIRE_DIR), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(autouse=True)
def host_state_untouched() -> Iterator[None]:
    """Fails the test that read or wrote /var/lib/mps-health, /run/mps-health, ..."""
    _TOUCHED.clear()
    with contextlib.suppress(FileNotFoundError):
        _TRIPWIRE_LOG.unlink()
    yield
    touched = list(_TOUCHED)
    with contextlib.suppress(FileNotFoundError):
        touched += _TRIPWIRE_LOG.read_text().splitlines()
        _TRIPWIRE_LOG.unlink()
    if touched:
        pytest.fail("the test touched the host's real mps-health state (give the config "
                    "tmp dirs): " + "; ".join(dict.fromkeys(touched))[:2000], pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Tests marked gpu skip unless a real GPU with MPS is here (or MPS_HEALTH_GPU_FAKE=1)."""
    import shutil

    if os.environ.get("MPS_HEALTH_GPU_FAKE") == "1":
        return
    control = shutil.which("nvidia-cuda-mps-control")
    real = False
    if control and shutil.which("nvidia-smi"):
        with open(control, "rb") as f:
            real = f.read(4) == b"\x7fELF"  # our fake is a script
    if real:
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with the MPS binaries "
                                   "(or MPS_HEALTH_GPU_FAKE=1 to run against the fake)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def fake_path(monkeypatch: pytest.MonkeyPatch) -> str:
    """The fake MPS binaries (then tests/fakes' mps-canary) first on PATH, for this process
    and the commands it starts."""
    path = os.pathsep.join((str(FAKE_BIN), str(FAKES), os.environ.get("PATH", "")))
    monkeypatch.setenv("PATH", path)
    return path


class FakeDaemon:
    """A fake control daemon serving ``pipe_dir``; quit (or killed by PID) at teardown."""

    def __init__(self, pipe_dir: Path, log_dir: Path, env: dict) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.env = env
        self.pid: Optional[int] = None

    def start(self) -> "FakeDaemon":
        self.pid = mpsdaemon.start_daemon(self.pipe_dir, self.log_dir, env=self.env)
        return self

    def query(self, command: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
        return mpsdaemon.query(self.pipe_dir, command, timeout=timeout)

    def signal(self, sig: int) -> None:
        assert self.pid is not None
        os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.pid is not None:
            mpsdaemon.kill_daemon(self.pid)
            self.pid = None


@pytest.fixture
def mps_dirs(tmp_path: Path) -> Callable[..., tuple]:
    """Make a pipe dir and a log dir (mode 0777) under tmp_path; returns (pipe, log)."""

    def make(name: str = "mps") -> tuple:
        pipe, log = tmp_path / f"{name}-pipe", tmp_path / f"{name}-log"
        for d in (pipe, log):
            d.mkdir()
            d.chmod(0o777)
        return pipe, log

    return make


@pytest.fixture
def fake_daemon(fake_path: str,
                mps_dirs: Callable[..., tuple]) -> Iterator[Callable[..., FakeDaemon]]:
    """Start fake daemons: ``fake_daemon(name="mps", **env)``; all stopped afterwards."""
    started: List[FakeDaemon] = []

    def start(name: str = "mps", **env: str) -> FakeDaemon:
        pipe, log = mps_dirs(name)
        d = FakeDaemon(pipe, log, env).start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def write_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def node_config(tmp_path: Path, pipe: Path, log: Path, extra: str = "") -> str:
    """A config for one node-wide instance on ``pipe``/``log`` with a private run dir."""
    return write_config(tmp_path / "config.yaml", f"""
run_dir: {tmp_path}/run
state_dir: {tmp_path}/state
mps:
  pipe_dir: {pipe}
  log_dir: {log}
{extra}
""")
