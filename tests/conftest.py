"""Shared fixtures: the fake MPS control binary on PATH, a node's site, the tripwire."""

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

# Tests live in folders by kind (unit, e2e, real, fleet, gpu); the shared helper modules
# in helpers/ (and this file, and gpu/'s mpsgpu) are imported by plain name from all of them.
_TESTS = Path(__file__).resolve().parent
for _path in (_TESTS, _TESTS / "gpu", _TESTS / "helpers"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# The real Slurm cluster (tests/helpers/slurm_fixture.py), the real-GPU fixtures (tests/gpu), and
# the private PID namespace of the tests that judge the whole node (tests/helpers/privatepids.py).
pytest_plugins = ["slurm_fixture", "mpsgpu", "privatepids"]

from nodesite import Site  # noqa: E402  (found through the path set above)
from paths import FAKE_BIN, FAKE_CONTROL, FAKE_SERVER, FAKES, FIXTURES, REPO, TESTS  # noqa: E402, F401

# Tripwire: no test may touch the host's real state (tests/tripwire/hostpaths.py). This
# process is watched by an audit hook, every Python program it starts by sitecustomize.
TRIPWIRE_DIR = _TESTS / "tripwire"
sys.path.insert(0, str(TRIPWIRE_DIR))
import hostpaths  # noqa: E402

_TOUCHED: List[str] = []
hostpaths.install(lambda event, path: _TOUCHED.append(f"{event} {path}"))
_TRIPWIRE_LOG = Path(f"/tmp/mps-health-tripwire-{os.getpid()}.log")
os.environ["MPS_HEALTH_TEST_TRIPWIRE"] = str(_TRIPWIRE_LOG)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TRIPWIRE_DIR), os.environ.get("PYTHONPATH")) if p)


# The host's mps-health state, as a fingerprint cheap enough to take around every test:
# each path and the entries directly in it (e.g. /var/log/mps-health/audit.log), their
# existence, mtime and size. The tripwire above sees only Python; this sees the fake
# binaries and every other program a test starts, and the host paths the tripwire allows.
HOST_STATE = ("/var/log/mps-health", "/var/lib/mps-health", "/run/mps-health",
              "/etc/mps-health", "/tmp/nvidia-mps")
Fingerprint = Dict[str, Tuple[int, int]]


def host_state_fingerprint() -> Fingerprint:
    found: Fingerprint = {}
    for top in HOST_STATE:
        try:
            st = os.lstat(top)
        except OSError:
            continue
        found[top] = (st.st_mtime_ns, st.st_size)
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError), os.scandir(top) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        est = entry.stat(follow_symlinks=False)
                        found[entry.path] = (est.st_mtime_ns, est.st_size)
    return found


def host_state_changes(before: Fingerprint, after: Fingerprint) -> List[str]:
    """What a test did to the host's state: only changes count, never what was there."""
    return [f"{'created' if path not in before else 'removed' if path not in after else 'changed'}"
            f" {path}" for path in sorted(before.keys() | after.keys())
            if before.get(path) != after.get(path)]


@pytest.fixture(autouse=True)
def host_state_untouched() -> Iterator[None]:
    """Fails the test that read or wrote /var/lib/mps-health, /run/mps-health, ... (the
    tripwire), or that created or changed anything of HOST_STATE (the fingerprint)."""
    before = host_state_fingerprint()  # before the tripwire listens: its scandir is no test's
    _TOUCHED.clear()
    with contextlib.suppress(FileNotFoundError):
        _TRIPWIRE_LOG.unlink()
    yield
    touched = list(_TOUCHED)  # before the fingerprint's own scandir lands there
    touched += host_state_changes(before, host_state_fingerprint())
    with contextlib.suppress(FileNotFoundError):
        touched += _TRIPWIRE_LOG.read_text().splitlines()
        _TRIPWIRE_LOG.unlink()
    if touched:
        pytest.fail("the test touched the host's real mps-health state (give the config "
                    "tmp dirs, a repair's audit log too: remhelp.audit_in): " + "; ".join(dict.fromkeys(touched))[:2000], pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Tests marked gpu skip unless a real GPU with MPS is here (or MPS_HEALTH_GPU_FAKE=1)."""
    import shutil

    if os.environ.get("MPS_HEALTH_GPU_FAKE") == "1":
        return
    control = shutil.which("nvidia-cuda-mps-control")
    real = False
    if control and shutil.which("nvidia-smi"):
        with open(control, "rb") as f:
            real = f.read(4) == b"\x7fELF"  # our fakes are not on PATH at collection
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
    from paths import FAKE_BIN_ERROR

    if FAKE_BIN_ERROR:
        pytest.fail(f"the fake MPS binaries could not be built: {FAKE_BIN_ERROR}",
                    pytrace=False)
    path = os.pathsep.join((str(FAKE_BIN), str(FAKES), os.environ.get("PATH", "")))
    monkeypatch.setenv("PATH", path)
    return path


@pytest.fixture
def site(fake_path: str) -> Iterator[Site]:
    """A node's site under a fresh root (tests/helpers/nodesite.py), tests/fakes first on PATH
    and, where mps-health looks, in its config's mps.binary_dirs; its daemons and
    processes ended and its root removed afterwards."""
    s = Site.create(binary_dirs=(str(FAKE_BIN),))
    yield s
    s.close()
