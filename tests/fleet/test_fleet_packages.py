"""The wheel and sdist install cleanly with pip (fresh venv) and pipx (private PIPX_HOME),
and the installed programs run."""
# ruff: noqa: F811  (dists comes from fleethelp)

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fleethelp import dists, need  # noqa: F401


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("which", ["wheel", "sdist"])
def test_pip_install(dists, tmp_path: Path, which: str) -> None:
    venv = tmp_path / "venv"
    # --system-site-packages: the dependencies without the network; ours is installed anew.
    assert _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)]).returncode == 0
    # The sdist builds in pip's isolated environment (setuptools and wheel from the index).
    r = _run([str(venv / "bin/pip"), "install", str(getattr(dists, which))])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = _run([str(venv / "bin/mps-health"), "--version"])
    assert v.returncode == 0 and v.stdout.strip() == "mps-health 0.1.0", v
    n = _run([str(venv / "bin/check_mps"), "-V"])
    assert n.returncode == 3 and "0.1.0" in n.stdout + n.stderr, n  # plugins exit 3 on -V
    where = _run([str(venv / "bin/python"), "-c",
                  "import mps_health.remediation.unit as u; print(u.__file__)"])
    assert where.stdout.startswith(str(venv)), where


def test_pipx_install(dists, tmp_path: Path) -> None:
    pipx = need("pipx")
    env = dict(os.environ, PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"),
               PIPX_MAN_DIR=str(tmp_path / "man"))
    # A venv of its own, its dependencies from the package index, as an admin's pipx does.
    # (Not --system-site-packages: pipx then judges the package by the copy it finds last
    # on that path, the test runner's own install of mps-health, whose commands are not in
    # pipx's venv, and finds "no apps".)
    r = _run([pipx, "install", str(dists.wheel)], env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # pipx links the commands onto PATH: mps-health, check_mps, mps-health-healthcheck.
    v = _run([str(tmp_path / "bin/mps-health"), "--version"])
    assert v.returncode == 0 and v.stdout.strip() == "mps-health 0.1.0", v
    assert (tmp_path / "bin/mps-health-healthcheck").exists()
    n = _run([str(tmp_path / "bin/check_mps"), "-V"])
    assert n.returncode == 3 and "0.1.0" in n.stdout + n.stderr, n
