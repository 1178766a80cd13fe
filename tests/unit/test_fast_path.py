"""What `mps-health check` and `check_mps` import on a node's every run: no typing (and no
NamedTuple built by it), no argparse, re, json anywhere, no monitoring library, and
none of the standard modules that cost most of a millisecond each for little (enum,
threading, signal, importlib, contextlib: plain ints, _thread, __import__ do the job).
check_mps is a nagiosplugin check (the design card's library): what nagiosplugin itself
imports (logging, re, json, signal, ...) it pays, and nothing heavy besides.

bench/check_speed.py measures what this costs; this test keeps the imports from coming
back unnoticed. It imports, in a fresh interpreter, every module a default check runs
(the registry's default checks and the sources they need) and the state and codec the
deep checks read their memory with.
"""

import subprocess
import sys

from mps_health.model import registry

HEAVY = ("typing", "argparse", "re", "json", "secrets", "random", "hashlib", "yaml",
         "subprocess", "dataclasses", "prometheus_client", "nagiosplugin", "enum",
         "threading", "signal", "importlib", "contextlib")


def modules_of_a_default_check():
    checks = [c for c in registry.CHECKS.values() if c.default_on]
    targets = [c.target for c in checks]
    targets += [registry.SOURCES[n].target for c in checks for n in c.needs]
    names = {t.partition(":")[0] for t in targets}  # relative to the package
    return sorted("mps_health" + n if n.startswith(".") else n for n in names)


def heavy_imports(imports, heavy=HEAVY):
    """The ``heavy`` modules that importing ``imports`` asks for, in a fresh interpreter.
    Each is blocked (an interpreter's start-up, a .pth file, may have loaded it already),
    so any import of one fails and is named."""
    code = ("import sys\n"
            f"for name in {tuple(heavy)!r}:\n"
            "    sys.modules[name] = None\n"
            f"for module in {list(imports)!r}:\n"
            "    try:\n"
            "        __import__(module)\n"
            "    except ImportError as e:\n"
            "        print('NEEDS', e.name, 'FOR', module)\n"
            "        sys.exit(0)\n"
            "print('NEEDS', 'nothing')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "NEEDS" in r.stdout, r.stdout + r.stderr
    return r.stdout.split("NEEDS ", 1)[1].strip()


def test_a_default_check_imports_nothing_heavy() -> None:
    mods = ["mps_health.cli.main", "mps_health.cli.check", "mps_health.engine.run",
            "mps_health.exporters.text", "mps_health.hostio.state", "mps_health.model.codec",
            *modules_of_a_default_check()]
    assert "mps_health.probes.control" in mods and "mps_health.checks.daemon" in mods
    assert heavy_imports(mods) == "nothing"


def loaded_by(module: str):
    """The HEAVY modules in sys.modules once ``module`` is imported, in a fresh interpreter."""
    code = f"import sys, {module}; print(' '.join(n for n in {HEAVY!r} if n in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_check_mps_imports_nothing_heavy_but_nagiosplugins_own() -> None:
    library = loaded_by("nagiosplugin")
    rest = [name for name in HEAVY if name not in library and name != "nagiosplugin"]
    assert heavy_imports(["mps_health.cli.check_mps", "mps_health.exporters.nagios",
                          "mps_health.exporters.series"], rest) == "nothing"


def test_a_heavy_import_is_caught() -> None:
    assert heavy_imports(["mps_health.cli.main", "argparse"]) == "argparse FOR argparse"
    assert heavy_imports(["mps_health.cli.main", "threading"]) == "threading FOR threading"
    assert heavy_imports(["mps_health.engine.snapshot"]).split()[0] in ("json", "importlib")


def whole_run(argv, blocked, path: str) -> str:
    """The output of ``mps-health ARGV`` in a fresh interpreter where importing any of
    ``blocked`` fails, with ``path`` as PATH."""
    code = ("import sys\n"
            f"for name in {tuple(blocked)!r}:\n"
            "    sys.modules[name] = None\n"
            "from mps_health.cli.main import main\n"
            f"sys.exit(main({list(argv)!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env={"PATH": path})
    return r.stdout + r.stderr


def test_a_whole_default_check_asks_for_nothing_heavy(tmp_path) -> None:
    """A whole run (every lazy import included) over an empty --root, which writes
    nothing: a heavy import anywhere fails, and the engine would name it."""
    out = whole_run(["check", "-v", "--root", str(tmp_path)],
                    ("typing", "argparse", "secrets", "random", "hashlib", "threading",
                     "signal", "importlib", "contextlib", "re", "json", "enum"),
                    "/usr/bin:/bin")
    assert "gathered:" in out, out
    for failure in ("ImportError", "ModuleNotFoundError", "halted", "NameError"):
        assert failure not in out, out


def test_the_state_files_are_read_and_written_without_json(tmp_path) -> None:
    """The deep checks' memory (state.StateFile, codec) round-trips with re, json and enum
    blocked: a node's every check reads and writes it."""
    code = ("import sys\n"
            "for name in ('re', 'json', 'enum', 'typing'):\n"
            "    sys.modules[name] = None\n"
            "from mps_health.hostio.state import StateFile\n"
            "from mps_health.model import facts_deep\n"
            "value = {'node': facts_deep.ServerMemory(daemon_pid=7, daemon_start=9,\n"
            "         servers=(), events=(), taken_at=1.5)}\n"
            "with_names = vars(facts_deep)\n"
            f"state = StateFile({str(tmp_path)!r}, 'servers')\n"
            "assert state.lock(float('inf')), state.error\n"
            "assert state.save(value) == ''\n"
            "state.unlock()\n"
            "back, why = state.load('Dict[str, ServerMemory]', {}, with_names)\n"
            "assert why == '' and back == value, (back, why)\n"
            "print('OK')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "OK", r.stdout + r.stderr
    assert (tmp_path / "servers.json").read_text().startswith('{"node": {"daemon_pid": 7')


def test_the_cycle_collector_stays_off_for_a_check_only(tmp_path) -> None:
    """The installed scripts turn the collector off; a plain check leaves it off, any
    other command (the exporter runs for weeks) turns it back on before it starts."""
    code = ("import gc, sys\n"
            "from mps_health.cli.main import dispatch\n"
            "gc.disable()\n"
            f"dispatch(['check', '--root', {str(tmp_path)!r}])\n"
            "after_check = gc.isenabled()\n"
            "try:\n"
            "    dispatch(['exporter', '--no-such-option'])\n"
            "except Exception:  # the bad option's UsageError: argparse ran\n"
            "    pass\n"
            "print(after_check, gc.isenabled())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert r.stdout.splitlines()[-1:] == ["False True"], r.stdout + r.stderr


def test_slurmds_health_check_asks_for_nothing_heavy(tmp_path) -> None:
    """What slurmd runs every few minutes (mps-health-healthcheck) takes the hand parser
    and the fast path as a check does: a whole dry run over an empty --root (no Slurm
    client on PATH: the node cannot be read, which is a line, not a failure)."""
    out = whole_run(["healthcheck", "--foreground", "--dry-run", "--root", str(tmp_path)],
                    ("typing", "argparse", "re", "json", "enum", "secrets", "random",
                     "hashlib", "threading", "signal", "importlib", "contextlib",
                     "subprocess", "gettext", "math"),
                    "/nonexistent")
    assert "MPS-HC:" in out, out
    for failure in ("ImportError", "ModuleNotFoundError", "halted", "NameError", "Traceback"):
        assert failure not in out, out
