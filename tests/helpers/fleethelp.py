"""Helpers for the fleet tests: build the wheel and sdist once per session, and a
wheelhouse of mps-health's dependencies as this interpreter has them installed."""

import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, NamedTuple, Set

import pytest
from paths import REPO

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


def _requires(name: str) -> List[str]:
    """Names of a distribution's unconditional requirements (no extras)."""
    from importlib import metadata

    out = []
    for req in metadata.requires(name) or ():
        if "extra ==" in req:
            continue
        m = re.match(r"[A-Za-z0-9._-]+", req)
        if m:
            out.append(m.group(0))
    return out


def repack(name: str, dest: Path) -> Path:
    """An installed distribution as a wheel again: its files and dist-info, as pip put
    them. Its original tag is in its dist-info WHEEL file."""
    import zipfile
    from importlib import metadata

    dist = metadata.distribution(name)
    info = next(f for f in dist.files or () if f.name == "METADATA").parent
    wheel_text = (dist.locate_file(info) / "WHEEL").read_text()  # type: ignore[operator]
    tag = next(line.split(":", 1)[1].strip() for line in wheel_text.splitlines()
               if line.startswith("Tag:"))
    stem = f"{re.sub(r'[-.]+', '_', dist.metadata['Name'])}-{dist.version}"
    path = dest / f"{stem}-{tag}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files or ():
            where = Path(str(dist.locate_file(f)))
            if f.parts[0] == ".." or "__pycache__" in f.parts or f.name in (
                    "RECORD", "INSTALLER", "REQUESTED", "direct_url.json") or not where.is_file():
                continue
            data = where.read_bytes()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{f},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="session")
def wheelhouse(dists: Dists) -> Iterator[Path]:
    """mps-health's dependencies, repacked from this interpreter's install: a nested
    virtualenv gets them with ``pip --no-index --find-links`` (the outer venv's packages
    are not the base interpreter's, which is all --system-site-packages would give)."""
    from importlib import metadata

    out = Path(tempfile.mkdtemp(prefix="mpsh-wheels-"))
    try:
        wanted = ["mps-health"]
        seen: Set[str] = set()
        while wanted:
            name = wanted.pop()
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key in seen:
                continue
            seen.add(key)
            try:
                deps = _requires(name)
            except metadata.PackageNotFoundError:
                pytest.skip(f"{name} (a dependency of mps-health) is not installed here")
            wanted += deps
            if key != "mps-health":
                repack(name, out)
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)
