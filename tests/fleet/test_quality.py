"""Packaging and code quality: one import namespace, ruff and mypy clean."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO


def test_wheel_installs_one_namespace(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    [wheel] = tmp_path.glob("mps_health-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.startswith("mps_health-")} == {"mps_health"}
    for sub in ("checks", "cli", "config", "engine", "exporters", "healthcheck", "hostio",
                "model", "probes", "remediation", "slurm"):
        assert f"mps_health/{sub}/__init__.py" in names
    # The commands are [project.scripts] entry points: the installer writes their
    # wrappers, and the wheel ships no script of its own.
    assert not any(n.split("/")[0].endswith(".data") and "/scripts/" in n for n in names)
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert zipfile.ZipFile(wheel).read(entry_points).decode().split() == [
        "[console_scripts]", "check_mps", "=", "mps_health.cli.check_mps:main",
        "mps-health", "=", "mps_health.cli.main:main",
        "mps-health-healthcheck", "=", "mps_health.cli.main:healthcheck_main"]


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    r = subprocess.run(["ruff", "check", "--no-cache", str(REPO)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout


def test_mypy_clean(tmp_path: Path) -> None:
    if shutil.which("mypy") is None:
        pytest.skip("mypy not installed (pip install -e '.[test]')")
    # The root is the package and every import inside it is relative, so mypy follows
    # them by file location. It names the package after the checkout's folder, which must
    # then be an identifier; a clone may be called anything (mps-health, ci-check), so the
    # package is given by name through one link called mps_health.
    (tmp_path / "mps_health").symlink_to(REPO)
    r = subprocess.run(["mypy", "--config-file", str(REPO / "pyproject.toml"),
                        "--cache-dir", str(tmp_path / ".cache"), "-p", "mps_health"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=dict(os.environ, MYPYPATH=str(tmp_path)))
    assert r.returncode == 0, r.stdout
