"""Helpers for the fleet tests: build the wheel and sdist once per session."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
CONTRIB = REPO / "contrib"


class Dists(NamedTuple):
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def dists() -> Iterator[Dists]:
    """``python -m build`` of this checkout (no isolation: setuptools as installed)."""
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.skip("python -m build is missing: pip install build (the test extra has it)")
    out = Path(tempfile.mkdtemp(prefix="mpsh-dist-"))
    try:
        r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(out), str(REPO)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
        assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
        yield Dists(wheels[0], sdists[0])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def need(program: str) -> str:
    found = shutil.which(program) or (
        str(Path(sys.executable).parent / program)
        if (Path(sys.executable).parent / program).exists() else None)
    if not found:
        pytest.skip(f"{program} is not installed")
    return found
