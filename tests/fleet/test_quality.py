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
    # The commands are the scripts in bin/ (pyproject.toml says why), not entry points:
    # pip rewrites their first line to its interpreter; they turn off the cycle collector
    # (a short run), serve our modules from the kept compiled code (hostio/codecache.py)
    # and import only their main.
    scripts = {n.rsplit("/", 1)[1]: zipfile.ZipFile(wheel).read(n).decode() for n in names
               if "/scripts/" in n and n.split("/")[0].endswith(".data")}
    assert set(scripts) == {"mps-health", "check_mps", "mps-health-healthcheck"}
    for text in scripts.values():
        code = [line for line in text.splitlines()[1:] if line and not line.startswith("#")]
        assert text.startswith("#!python\n") and code[:2] == ["import gc", "gc.disable()"], text
        assert code[2] == "from mps_health.hostio.codecache import serve", text
        assert code[3].split("#")[0].rstrip() == "serve()", text
        assert code[4].startswith("from mps_health.cli.") and " import " in code[4], text
        assert len(code) == 6 and code[5] == code[4].split()[-1] + "()", text
    assert not any(n.endswith("entry_points.txt") for n in names)


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
