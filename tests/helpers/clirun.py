"""The commands under test, run the one way every test runs them.

Each command is the console script its entry point installs next to the interpreter
(``pip install -e .`` writes them into the virtualenv's bin/), so a test runs what a node
runs; output is captured as text and every call has a timeout. Where that interpreter
has no such script (a checkout on sys.path, nothing installed), the command runs as
``python -m`` of the module whose function the entry point names (``ENTRY_POINTS``,
as pyproject.toml's ``[project.scripts]`` says).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

# command -> (the module, the arguments its main is given before the command's own)
ENTRY_POINTS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "mps-health": ("mps_health.cli.main", ()),
    "check_mps": ("mps_health.cli.check_mps", ()),
    "mps-health-healthcheck": ("mps_health.cli.main", ("healthcheck",)),
}


def argv(command: str, *args: str, python: str = sys.executable) -> List[str]:
    """The argv that runs ``command args`` (for Popen: servers, processes a test signals)."""
    script = Path(python).parent / command
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), *args]
    module, before = ENTRY_POINTS[command]
    return [python, "-m", module, *before, *args]


def run(command: str, *args: str, env: Optional[Mapping[str, str]] = None,
        inherit: bool = True, timeout: float = 60, show: bool = False,
        python: str = sys.executable, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run ``command args`` with this environment plus ``env`` (only ``env`` when not
    ``inherit``); ``show`` prints it for the record (the GPU runs, read with -s)."""
    full = dict(os.environ, **(env or {})) if inherit else dict(env or {})
    r = subprocess.run(argv(command, *args, python=python), capture_output=True, text=True,
                       timeout=timeout, env=full, **kwargs)
    if show:
        print(f"$ {command} {' '.join(args)}  -> exit {r.returncode}")
        print((r.stdout + r.stderr).rstrip(), flush=True)
    return r


def mps_health(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run("mps-health", *args, **kwargs)


def check_mps(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run("check_mps", *args, **kwargs)


def installed(script: str) -> str:
    """The installed console script (next to this Python, or on PATH), for callers that
    need a program path: slurmd's HealthCheckProgram, a shell wrapper."""
    exe = Path(sys.executable).parent / script
    if exe.exists():
        return str(exe)
    found = shutil.which(script)
    assert found, f"{script} is not installed (pip install -e .)"
    return found


def report(r: subprocess.CompletedProcess) -> Dict[str, Any]:
    """The JSON report of a ``--format json`` run."""
    data: Dict[str, Any] = json.loads(r.stdout)
    return data


def results(r: subprocess.CompletedProcess, check: str) -> List[dict]:
    """The results one check gave in a ``--format json`` run."""
    return [x for c in report(r)["checks"] if c["name"] == check for x in c["results"]]


def problem_codes(r: subprocess.CompletedProcess) -> List[str]:
    """The codes of the problems of a ``--format json`` run, in report order."""
    return [p["code"] for p in report(r)["problems"]]
