"""`mps-health check` (and `check_mps`, `mps-health-healthcheck`) load no heavy
third-party library they do not use: NVML's bindings, the Prometheus client and Jinja2
belong to the exporter, the NVML check and the Slurm tools. Each run is a fresh
interpreter whose `sys.modules` is read once the command has returned."""

import subprocess
import sys

import pytest

HEAVY = ("pynvml", "prometheus_client", "jinja2")


def loaded_after(call: str, tmp_path) -> set:
    """The HEAVY modules in sys.modules after ``call`` (a Python expression) ran in a fresh
    interpreter, with an empty --root tree in ``ROOT`` and no program on PATH (the health
    check finds no Slurm client: the node cannot be read, which is a line, not a failure;
    no Slurm of this machine is asked)."""
    code = (f"import sys\nROOT = {str(tmp_path)!r}\n{call}\n"
            f"print('LOADED', ' '.join(n for n in {HEAVY!r} if n in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/nonexistent"})
    lines = [line for line in r.stdout.splitlines() if line.startswith("LOADED")]
    assert lines, r.stdout + r.stderr
    return set(lines[-1].split()[1:])


@pytest.mark.parametrize("call", [
    "from mps_health.cli.main import main; main(['check', '--root', ROOT])",
    "from mps_health.cli.main import main; main(['check', '-v', '--format', 'json', "
    "'--root', ROOT])",
    "from mps_health.cli.check_mps import main; main(['--root', ROOT, '-t', '20'])",
    "from mps_health.cli.main import main; main(['healthcheck', '--foreground', '--dry-run', "
    "'--root', ROOT])",
])
def test_a_check_loads_no_heavy_library_it_does_not_use(call: str, tmp_path) -> None:
    assert loaded_after(call, tmp_path) == set()


def test_the_probe_sees_a_heavy_library_loaded(tmp_path) -> None:
    """The same probe names what a command that does use one loads."""
    assert loaded_after("import mps_health.exporters.prometheus", tmp_path) == {
        "prometheus_client"}
