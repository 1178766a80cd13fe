"""The fake MPS binaries as executable files: tests/fakes/launcher.c built once per checkout.

mps-health judges a daemon or server by the binary it runs (/proc/PID/exe), so the fakes
must be executables at the configured path, like the real ones, not scripts run by an
interpreter. ``fake_bin()`` builds ``nvidia-cuda-mps-control`` and ``nvidia-cuda-mps-server``
(each the launcher with its fake script compiled in) into one directory, world-readable
so that job users can run them, and reuses it while the sources are unchanged. It embeds
the system's Python 3 (``/usr/bin/python3-config``, from Debian's python3-dev) and carries
it along (its library, found through the launcher's own directory, and the standard
library the fakes need), so the fakes also run in another distribution's root that sees
this directory (the Debian 13 root of the Slurm 24.11 tests shares /tmp).
"""

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Tuple

FAKES = Path(__file__).resolve().parent.parent / "fakes"
SOURCE = FAKES / "launcher.c"
NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
PYTHON_CONFIG = "/usr/bin/python3-config"
SYSTEM_PYTHON = "/usr/bin/python3"


class FakeBinError(RuntimeError):
    pass


def _flags() -> list:
    if not os.access(PYTHON_CONFIG, os.X_OK):
        raise FakeBinError(f"{PYTHON_CONFIG} is missing: install python3-dev (the fake MPS "
                           "binaries embed the system's Python)")
    out = subprocess.run([PYTHON_CONFIG, "--embed", "--cflags", "--ldflags"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return shlex.split(out)


def _interpreter() -> Tuple[Path, Path]:
    """(the system Python's shared library, its standard library dir)."""
    code = ("import sysconfig as s; print(s.get_config_var('LIBDIR') + '/' + "
            "s.get_config_var('INSTSONAME')); print(s.get_path('stdlib'))")
    lib, stdlib = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.split()
    return Path(lib), Path(stdlib)


# Parts of the standard library the fakes never import: not carried along.
NOT_CARRIED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
               "pydoc_data", "__pycache__", "site-packages", "dist-packages", "config-3.*")


def _ours(directory: Path) -> bool:
    """A complete build that only we could have written (/tmp is everyone's)."""
    try:
        for path in (directory, *(directory / name for name in NAMES)):
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022 or path.is_symlink():
                return False
    except OSError:
        return False
    return all(os.access(directory / name, os.X_OK) for name in NAMES)


def fake_bin(fast_client: bool = False) -> Path:
    """The directory holding the built fakes (built now if missing or out of date); with
    ``fast_client`` the control binary's client is in C (for benchmarks)."""
    flags = _flags()
    libpython, stdlib = _interpreter()
    variant = ["-DFAST_CLIENT"] if fast_client else []
    key = hashlib.sha256("\0".join([SOURCE.read_text(), str(FAKES), str(libpython), *flags,
                                    *variant]).encode()).hexdigest()[:16]
    final = Path(tempfile.gettempdir()) / f"mps-health-fakebin-{key}"
    home = str(final)  # the interpreter's prefix: final/lib/python3.X, as carried along
    if _ours(final):
        return final
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FakeBinError("no C compiler (cc): install gcc to build the fake MPS binaries")
    work = Path(tempfile.mkdtemp(prefix="mps-health-fakebin-build-"))
    try:
        shutil.copy2(libpython, work / libpython.name)
        shutil.copytree(stdlib, work / "lib" / stdlib.name, symlinks=True,
                        ignore=shutil.ignore_patterns(*NOT_CARRIED))
        for name in NAMES:
            script = FAKES / name
            fast = variant if name == NAMES[0] else []
            linked = flags
            if fast:  # the C client: libpython opened for the daemon modes only
                linked = [f for f in flags if not f.startswith("-lpython")]
                fast = [*fast, f'-DLIBPYTHON="{libpython.name}"']
            subprocess.run([cc, "-O1", "-o", str(work / name), str(SOURCE), *fast,
                            f'-DFAKE="{script}"', f'-DPYHOME="{home}"', *linked,
                            "-Wl,-rpath,$ORIGIN"],
                           check=True, capture_output=True, text=True, timeout=120)
        work.chmod(0o755)
        try:
            os.rename(work, final)
        except OSError:  # built meanwhile by another session: use that one
            if not _ours(final):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def install_fakes(bindir: Path, fast_client: bool = True) -> Path:
    """Copies of the fake binaries in ``bindir`` (a node's driver dir for benchmarks);
    returns the control binary. The daemon finds the server beside itself."""
    built = fake_bin(fast_client)
    bindir.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        shutil.copy2(built / name, bindir / name)
    return bindir / NAMES[0]
