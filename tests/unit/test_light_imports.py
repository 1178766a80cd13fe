"""`mps-health check` (and `check_mps`, `mps-health-healthcheck`) load no heavy
third-party library they do not use: NVML's bindings, the Prometheus client and Jinja2
belong to the exporter, the NVML check and the Slurm tools. And on a healthy node they
import only the modules listed here (by name: a new import shows in CI, with no timing).
Each run is a fresh interpreter whose `sys.modules` is read once the command has
returned."""

import os
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


# --- what a healthy run imports --------------------------------------------------------
# The standard library and third-party modules (top-level names) `mps-health check` may
# import on a healthy node, beyond what the interpreter loaded before it: a new import on
# this path costs every run on every node (slurmd's health check, Nagios, cron), so it is
# added here on purpose or made lazy. What the interpreter imports for it differs by
# version: the names of 3.9's and 3.10's re (sre_*), 3.9's subprocess (grp), and the Cython
# runtime of PyYAML's C loader. shlex quotes the commands actions advise (it needs only re).
HEALTHY_CHECK = frozenset((
    "__future__", "_collections", "_datetime", "_functools", "_json", "_locale", "_operator",
    "_posixsubprocess", "_sre", "_struct", "_typing", "_weakrefset", "argparse", "base64",
    "binascii", "collections", "contextlib", "copyreg", "datetime", "enum", "errno", "fcntl",
    "fnmatch", "functools", "gettext", "importlib", "itertools", "json", "keyword", "locale",
    "math", "operator", "pwd", "re", "reprlib", "resource", "select", "selectors", "shlex",
    "signal", "struct", "subprocess", "threading", "types", "typing", "warnings", "yaml",
    "sre_compile", "sre_constants", "sre_parse", "grp", "cython_runtime"))
# What check_mps adds: nagiosplugin and what it imports itself (logging, tempfile for its
# cookie, random for tempfile's names).
NAGIOSPLUGIN = frozenset((
    "nagiosplugin", "_bisect", "_bz2", "_compression", "_lzma", "_random", "_sha2", "_sha512",
    "_string", "atexit", "bisect", "bz2", "linecache", "logging", "lzma", "numbers", "random",
    "shutil", "string", "tempfile", "textwrap", "token", "tokenize", "traceback", "weakref",
    "zlib", "_colorize", "_opcode_metadata"))
# Never on a healthy run: what only a fault, another command or another output needs
# (the blockers' socket diagnosis, remediation, Slurm, the other outputs, replay), and
# the modules a run once loaded for nothing it used (secrets for one random name,
# dataclasses and inspect through pkgutil, ctypes for renameat2, shutil for argparse's
# terminal width, string for a template check).
NEVER_HEALTHY = ("mps_health.hostio.unixdiag", "mps_health.hostio.runas",
                 "mps_health.remediation", "mps_health.healthcheck", "mps_health.slurm",
                 "mps_health.probes.slurm", "mps_health.probes.nvml",
                 "mps_health.exporters.json", "mps_health.exporters.prometheus",
                 "mps_health.engine.snapshot", "secrets", "hashlib", "hmac", "random",
                 "dataclasses", "inspect", "pkgutil", "ast", "dis", "ctypes", "socket",
                 "shutil", "string", "logging", "tempfile", "_strptime")


def healthy_run(call: str) -> set:
    """Every module ``call`` (a Python expression, with CONFIG the config file's path)
    imported in a fresh interpreter, beyond what the interpreter had loaded before it;
    the node's control daemon answers (tests/fakes)."""
    code = ("import sys\nbefore = set(sys.modules)\n" f"{call}\n"
            "print('LOADED', ' '.join(sorted(set(sys.modules) - before)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=os.environ)
    lines = [line for line in r.stdout.splitlines() if line.startswith("LOADED")]
    assert lines, r.stdout + r.stderr
    assert "MPS OK" in r.stdout, r.stdout  # the healthy path, not a failure's
    return set(lines[-1].split()[1:])


def outside(loaded: set, allowed: frozenset) -> list:
    """The names in ``loaded`` (but mps-health's own) whose top level ``allowed`` lacks;
    C modules of PyYAML's Cython (``_cython_3_0_11``) are its own."""
    return sorted(m for m in loaded if not m.startswith(("mps_health", "_cython_"))
                  and m.split(".")[0] not in allowed)


SKIP = "tmpfiles,strays"


@pytest.fixture
def healthy_config(site) -> str:
    """A healthy node (one daemon that answers) and its config file; one check already
    ran, so the log and state are as on a node between two runs. strays and tmpfiles
    judge the whole machine, where other tests' daemons may run: skipped (SKIP)."""
    site.start_daemon()
    config = site.config()
    first = subprocess.run([sys.executable, "-m", "mps_health.cli.main", "check", "--config",
                            config, "--skip", SKIP], capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    return config


@pytest.mark.parametrize("call, allowed", [
    ("from mps_health.cli.main import main; main(['check', '--config', CONFIG, '--skip', "
     "SKIP])", HEALTHY_CHECK),
    ("from mps_health.cli.check_mps import main; main(['--config', CONFIG, '--skip', SKIP])",
     HEALTHY_CHECK | NAGIOSPLUGIN),
])
def test_a_healthy_run_imports_only_what_it_uses(call: str, allowed: frozenset,
                                                 healthy_config: str) -> None:
    loaded = healthy_run(f"CONFIG, SKIP = {healthy_config!r}, {SKIP!r}\n{call}")
    assert outside(loaded, allowed) == []
    never = NEVER_HEALTHY if "check_mps" not in call else tuple(
        m for m in NEVER_HEALTHY if m.split(".")[0] not in NAGIOSPLUGIN)
    assert sorted(m for m in loaded if m in never or m.startswith(tuple(n + "." for n in never))
                  ) == []
