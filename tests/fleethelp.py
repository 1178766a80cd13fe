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
    out = Path(tempfile.mkdtemp(prefix="mpsh-dist-"))
    # Run from outside the checkout: a build/ folder left in it by an earlier build would
    # shadow the `build` package.
    probe = subprocess.run([sys.executable, "-c", "import build.__main__"], cwd=out,
                           capture_output=True, timeout=60)
    if probe.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        pytest.skip("python -m build is missing: pip install build (the test extra has it)")
    try:
        r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(out), str(REPO)], capture_output=True, text=True, timeout=300,
                           cwd=out)
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
