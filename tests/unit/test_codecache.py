"""The commands' kept compiled code (hostio/codecache.py), in a copy of the package.

Each run is a fresh interpreter started with -S (so no editable install's finder answers
for ``mps_health`` first) on a copy of the package's top and core/ in a temporary dir,
plus two modules of the test's own. What each run imported from the file, it prints.
"""

import marshal
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TAG = sys.implementation.cache_tag

RUN = """
import sys
sys.path.insert(0, {site!r})
from mps_health.hostio.codecache import CodeFinder, save, serve
serve()
import mps_health.demo, mps_health.demopkg.leaf
print("VALUE", mps_health.demo.VALUE, mps_health.demopkg.leaf.TWICE)
for name in ("mps_health.demo", "mps_health.demopkg", "mps_health.demopkg.leaf"):
    m = sys.modules[name]
    served = isinstance(m.__spec__.loader, CodeFinder)
    print("SERVED" if served else "SOURCE", name, m.__file__)
    print("ATTRS", name, m.__package__, m.__cached__, getattr(m, "__path__", None),
          m.__loader__ is m.__spec__.loader, m.__spec__.cached == m.__cached__)
print("PATH", mps_health.demopkg.__path__)
save()
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "mps_health"
    shutil.copytree(REPO / "core", pkg / "core",
                    ignore=shutil.ignore_patterns("__pycache__", "probes", "commands"))
    shutil.copy(REPO / "__init__.py", pkg / "__init__.py")
    (pkg / "demo.py").write_text('"""A module of ours."""\nVALUE = 1\n')
    (pkg / "demopkg").mkdir()
    (pkg / "demopkg" / "__init__.py").write_text("")
    (pkg / "demopkg" / "leaf.py").write_text("from ..demo import VALUE\nTWICE = 2 * VALUE\n")
    return tmp_path / "site"


def cache(site: Path) -> Path:
    return site / "mps_health" / "__pycache__" / f"mps_health.{TAG}.codes"


def run(site: Path, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    full.update(env)
    r = subprocess.run([sys.executable, "-S", "-c", RUN.format(site=str(site))],
                       capture_output=True, text=True, timeout=60, env=full)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    return r.stdout


def served(out: str) -> list:
    return [line.split()[1] for line in out.splitlines() if line.startswith("SERVED")]


def test_a_second_run_is_served_from_the_file_and_writes_nothing(site: Path) -> None:
    first = run(site)
    assert "VALUE 1 2" in first and served(first) == []
    assert cache(site).is_file() and cache(site).stat().st_mode & 0o777 == 0o644
    before = cache(site).stat()
    second = run(site)
    assert served(second) == ["mps_health.demo", "mps_health.demopkg",
                              "mps_health.demopkg.leaf"]
    pkg = site / "mps_health"
    assert f"mps_health.demo {pkg}/demo.py" in second
    assert f"mps_health.demopkg {pkg}/demopkg/__init__.py" in second
    assert f"PATH ['{pkg}/demopkg']" in second
    # The same modules, the same values, and the attributes Python's import gives them.
    assert second.replace("SERVED", "SOURCE") == first
    assert f"ATTRS mps_health.demo mps_health {pkg}/__pycache__/demo.{TAG}.pyc None True " \
           "True" in second
    assert f"ATTRS mps_health.demopkg mps_health.demopkg {pkg}/demopkg/__pycache__/" \
           f"__init__.{TAG}.pyc ['{pkg}/demopkg'] True True" in second
    after = cache(site).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_an_edited_module_is_read_from_its_source_and_the_file_rewritten(site: Path) -> None:
    run(site)
    demo = site / "mps_health" / "demo.py"
    demo.write_text('"""A module of ours."""\nVALUE = 21\n')
    edited = run(site)
    assert "VALUE 21 42" in edited
    assert served(edited) == ["mps_health.demopkg", "mps_health.demopkg.leaf"]
    # The same size, within the same second: seen (the mtime in ns, not in seconds as a
    # .pyc has it, so Python's own .pyc of it goes too).
    demo.write_text('"""A module of ours."""\nVALUE = 22\n')
    for pyc in (site / "mps_health" / "__pycache__").glob("demo.*.pyc"):
        pyc.unlink()
    assert "VALUE 22 44" in run(site)
    again = run(site)
    assert "VALUE 22 44" in again and len(served(again)) == 3


@pytest.mark.parametrize("junk", [b"\xff", marshal.dumps(42)])  # not marshal; not code
def test_damaged_code_is_compiled_from_source(site: Path, junk: bytes) -> None:
    run(site)
    data = bytearray(cache(site).read_bytes())
    head = int.from_bytes(data[:4], "little")
    _, _, index = marshal.loads(bytes(data[4:4 + head]))
    offset, length = index["mps_health.demo"][3:]
    start = 4 + head + offset
    data[start:start + length] = (junk * length)[:length]
    cache(site).write_bytes(bytes(data))
    out = run(site)
    assert "VALUE 1 2" in out and len(served(out)) == 3
    assert cache(site).read_bytes() != bytes(data)  # written anew
    assert "VALUE 1 2" in run(site)


SWAP = """
import os, sys
sys.path.insert(0, {site!r})
from mps_health.hostio.codecache import _finder, serve
serve()
finder = _finder()
{act}
import mps_health.demo
m = sys.modules["mps_health.demo"]
kept = "mps_health.demo" in finder.index and not finder.missed
print("VALUE", m.VALUE, "SERVED" if kept else "COMPILED")
"""


@pytest.mark.parametrize("act, expect", [
    # Written anew (another run's save renames a new file in) after this run opened it:
    # this run reads the file it checked, whole, and gets the code it indexed.
    ("os.rename({junk!r}, finder.path)", "VALUE 1 SERVED"),
    # Its fd closed behind its back and the number reused for another file: never read
    # as code; the module is compiled from its source.
    ("os.dup2(os.open({junk!r}, os.O_RDONLY), finder.fd)", "VALUE 1 COMPILED"),
])
def test_the_run_reads_the_file_it_checked(site: Path, tmp_path: Path, act: str,
                                          expect: str) -> None:
    run(site)
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(cache(site).stat().st_size))
    script = SWAP.format(site=str(site), act=act.format(junk=str(junk)))
    r = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in os.environ.items()
                                        if k != "PYTHONDONTWRITEBYTECODE"})
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    assert expect in r.stdout


@pytest.mark.parametrize("damage", ["garbage", "truncated", "group-writable", "symlink",
                                    "foreign-owner", "directory"])
def test_a_file_that_is_not_whole_or_not_ours_is_ignored(site: Path, tmp_path: Path,
                                                         damage: str) -> None:
    run(site)
    path = cache(site)
    good = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(os.urandom(len(good)))
    elif damage == "truncated":
        path.write_bytes(good[:len(good) // 2])
    elif damage == "group-writable":
        path.chmod(0o664)
    elif damage == "symlink":
        elsewhere = tmp_path / "elsewhere.codes"
        elsewhere.write_bytes(good)
        path.unlink()
        path.symlink_to(elsewhere)
    elif damage == "foreign-owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file away")
        os.chown(path, 65534, 65534)
    else:
        path.unlink()
        path.mkdir()
    out = run(site)
    assert "VALUE 1 2" in out and served(out) == []
    if damage != "directory":  # a file the run may replace is replaced
        assert len(served(run(site))) == 3
    if damage == "symlink":
        assert not path.is_symlink() and (tmp_path / "elsewhere.codes").read_bytes() == good


def test_pythondontwritebytecode_turns_it_off(site: Path) -> None:
    out = run(site, PYTHONDONTWRITEBYTECODE="1")
    assert "VALUE 1 2" in out and not cache(site).exists()
    run(site)
    kept = cache(site).stat()
    out = run(site, PYTHONDONTWRITEBYTECODE="1")
    assert "VALUE 1 2" in out and served(out) == []  # not read either
    assert cache(site).stat().st_mtime_ns == kept.st_mtime_ns


def test_a_user_who_cannot_write_there_is_served_what_root_wrote(site: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    # A copy nobody can read (pytest's own dirs are root's, 0700).
    shared = Path(tempfile.mkdtemp(prefix="codecache-"))
    try:
        shared.chmod(0o755)
        shutil.copytree(site, shared / "site")
        run(shared / "site")
        written = cache(shared / "site").stat()

        def as_nobody() -> str:
            r = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                 sys.executable, "-S", "-c", RUN.format(site=str(shared / "site"))],
                capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
            assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
            return r.stdout

        assert len(served(as_nobody())) == 3
        (shared / "site" / "mps_health" / "demo.py").write_text("VALUE = 5\n")
        out = as_nobody()  # stale for it; it cannot write, so it tries nothing
        assert "VALUE 5 10" in out and "mps_health.demopkg.leaf" in served(out)
        assert cache(shared / "site").stat().st_mtime_ns == written.st_mtime_ns
    finally:
        shutil.rmtree(shared)
