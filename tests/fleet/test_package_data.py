"""The wheel carries what a node reads without the source tree: the runbook
(docs/runbook.md, which `mps-health explain` reads), the README and the docs, the example config
(`mps-health config example`) and the files for the node's other programs (systemd
units, Nagios/Icinga definitions, alert rules: `mps-health contrib`), and the installed
commands find them."""
# ruff: noqa: F811  (dists comes from fleethelp)

import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO
from fleethelp import dists  # noqa: F401
from mps_health.cli.contrib import CARRIED


def test_the_wheel_carries_the_runbook_the_docs_and_the_example_config(dists) -> None:
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
        wanted = {"mps_health/README.md", "mps_health/docs/runbook.md",
                  "mps_health/contrib/config.example.yaml"}
        wanted |= {f"mps_health/{c.name}" for c in CARRIED}
        wanted |= {f"mps_health/contrib/systemd/{p.name}"  # every unit, listed or not
                   for p in (REPO / "contrib/systemd").iterdir() if p.is_file()}
        wanted |= {f"mps_health/docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
        assert sorted(wanted - names) == []
        for name in wanted:  # the same text as the checkout's
            assert whl.read(name) == (REPO / name.split("/", 1)[1]).read_bytes(), name


def test_the_installed_commands_read_them(dists, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run = {"capture_output": True, "text": True, "timeout": 300}
    assert subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                           str(venv)], **run).returncode == 0
    r = subprocess.run([str(venv / "bin/pip"), "install", "--no-deps", str(dists.wheel)], **run)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    explain = subprocess.run([str(venv / "bin/mps-health"), "explain", "daemon-stale"],
                             cwd=tmp_path, **run)
    assert explain.returncode == 0 and explain.stdout.startswith("daemon-stale\n"), explain
    example = subprocess.run([str(venv / "bin/mps-health"), "config", "example"],
                             cwd=tmp_path, **run)
    assert example.returncode == 0, example
    assert example.stdout == (REPO / "contrib/config.example.yaml").read_text()
    listed = subprocess.run([str(venv / "bin/mps-health"), "contrib"], cwd=tmp_path, **run)
    assert listed.returncode == 0, listed
    site = subprocess.run([str(venv / "bin/python"), "-c", "import mps_health, os; "
                           "print(os.path.dirname(mps_health.__file__))"], **run).stdout.strip()
    for c in CARRIED:  # each where pip put it, in the venv
        assert f"{site}/{c.name}" in listed.stdout, listed.stdout
    unit = subprocess.run([str(venv / "bin/mps-health"), "contrib", "nvidia-mps.service"],
                          cwd=tmp_path, **run)
    assert unit.returncode == 0 and \
        unit.stdout == (REPO / "contrib/systemd/nvidia-mps.service").read_text(), unit
