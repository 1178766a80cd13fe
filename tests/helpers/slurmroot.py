"""Slurm 24.11 for the test cluster: a Debian 13 root with slurm-wlm, munge and mps-health.

tests/helpers/slurmcluster.py runs its daemons either from this machine's own Slurm or, given
a :class:`SlurmRoot`, from the root. The root is a fresh copy of the cached Debian 13
root (tests/helpers/debian_root.py) with mps-health installed as a node would have it: a venv
at /opt/mps-health holding a wheel built from this checkout, plus the wheels of the
dependencies that wheel names (fetched once per list with ``pip download`` into the
test cache).

Paths are the same inside and outside: one private mount namespace, held by a small
process, mounts /tmp and the tests' fakes dir into the root at their own paths (plus
/dev, /proc and /sys). So slurm.conf, per-job dirs, configs and pipe dirs under /tmp
mean the same file on both sides. There is no PID namespace: daemons and job steps are
ordinary processes of this machine, found and stopped by PID as with the host's Slurm.
Every command enters the namespace with ``nsenter --mount`` and then ``chroot``s;
``client_dir`` holds wrappers (scontrol, squeue, ...) that do this, for code that finds
Slurm's clients on PATH (mps-health's own probes).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from clirun import argv
from paths import FAKES, REPO

PACKAGES = ["slurm-wlm", "munge", "python3", "python3-venv"]
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VENV = "/opt/mps-health"
CLIENTS = ("scontrol", "squeue", "sinfo", "srun", "sbatch", "scancel")
# The root's python3 (Debian 13) is 3.13: its binary wheels are fetched for that.
ROOT_PYTHON = "3.13"

# Runs as the namespace's first process: mounts, says "ready", then holds the namespace
# until its stdin closes (our end, or this test session dying).
HOLDER = """
import os, subprocess, sys
root, shared = sys.argv[1], sys.argv[2:]
def mount(*args):
    subprocess.run(["mount", *args], check=True, timeout=30)
mount("--rbind", "/dev", root + "/dev")
mount("-t", "proc", "proc", root + "/proc")
mount("--rbind", "-o", "ro", "/sys", root + "/sys")
for path in shared:
    os.makedirs(root + path, exist_ok=True)
    mount("--bind", path, root + path)
print("ready", flush=True)
sys.stdin.read()
"""


class SlurmRootError(RuntimeError):
    """The root could not be prepared (the message says which step)."""


def _run(argv: Sequence[str], what: str, timeout: float = 300) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SlurmRootError(f"{what} failed (exit {r.returncode}): "
                             f"{(r.stderr or r.stdout).strip()[-1500:]}")
    return r.stdout


def requirements(wheel: Path) -> List[str]:
    """The wheel's own Requires-Dist (pyproject's dependencies, as built)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    return sorted(line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("Requires-Dist:") and "extra ==" not in line)


def dependency_wheels(cache: Path, wanted: Sequence[str]) -> Path:
    """Wheels of ``wanted`` for the root's Python, fetched once per dependency list."""
    import hashlib

    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]
    folder = cache / f"wheels-cp{ROOT_PYTHON.replace('.', '')}-{key}"
    if folder.is_dir():
        return folder
    partial = Path(tempfile.mkdtemp(prefix="wheels-", dir=cache))
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
          "--python-version", ROOT_PYTHON, "--implementation", "cp",
          "--platform", "manylinux2014_x86_64", "-d", str(partial), *wanted],
         "pip download of mps-health's dependencies")
    with contextlib.suppress(OSError):  # another session may have won the race: keep its
        partial.rename(folder)
    shutil.rmtree(partial, ignore_errors=True)
    return folder


def checkout_wheel(dest: Path) -> Path:
    """A wheel of this checkout, built from a copy (no build/ left in the checkout)."""
    src = dest / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".*", "__pycache__", "build", "dist", "*.egg-info"))  # .git, caches, local wheels
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dest), str(src)], "building the mps-health wheel", timeout=300)
    shutil.rmtree(src, ignore_errors=True)
    [wheel] = dest.glob("mps_health-*.whl")
    return wheel


class SlurmRoot:
    """A prepared root (``path``) and, once :meth:`start`ed, the namespace it runs in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.holder: Optional[subprocess.Popen] = None
        self.client_dir = path.with_name(path.name + "-clients")

    # --- preparing ------------------------------------------------------------------
    def install_mps_health(self, cache: Path) -> None:
        """A venv at /opt/mps-health with this checkout's wheel (no network in the root)."""
        wheels = self.path / "opt" / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        ours = checkout_wheel(wheels)
        for whl in dependency_wheels(cache, requirements(ours)).glob("*.whl"):
            shutil.copy(whl, wheels)
        from debian_root import chroot_argv

        _run(chroot_argv(self.path, ["/usr/bin/python3", "-m", "venv", VENV]),
             "python3 -m venv in the root")
        _run(chroot_argv(self.path, [f"{VENV}/bin/pip", "install", "-q", "--no-index",
                                     "--find-links", "/opt/wheels", "mps-health"]),
             "pip install mps-health in the root")
        shutil.rmtree(wheels, ignore_errors=True)

    def add_user(self, name: str) -> None:
        """This machine's user ``name`` (same uid/gid) in the root's passwd and group."""
        pw = pwd.getpwnam(name)
        gr = grp.getgrgid(pw.pw_gid)
        etc = self.path / "etc"
        passwd = (etc / "passwd").read_text()
        if f"\n{name}:" in "\n" + passwd:
            return
        with open(etc / "passwd", "a") as f:
            f.write(f"{name}:x:{pw.pw_uid}:{pw.pw_gid}::/nonexistent:/bin/sh\n")
        if f"\n{gr.gr_name}:" not in "\n" + (etc / "group").read_text():
            with open(etc / "group", "a") as f:
                f.write(f"{gr.gr_name}:x:{gr.gr_gid}:\n")

    # --- the namespace --------------------------------------------------------------
    def start(self) -> SlurmRoot:
        shared = ["/tmp", str(FAKES)]
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-I", "-c",
             HOLDER, str(self.path), *shared],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            err = self.holder.stderr.read() if self.holder.stderr else ""
            self.stop()
            raise SlurmRootError(f"the root's mount namespace did not come up: {err.strip()}")
        self.client_dir.mkdir(mode=0o755, exist_ok=True)
        for name in CLIENTS:
            wrapper = self.client_dir / name
            wrapper.write_text("#!/bin/sh\n# Slurm's client of the Debian 13 test root.\n"
                               f"exec {' '.join(self.wrap([f'/usr/bin/{name}']))} \"$@\"\n")
            wrapper.chmod(0o755)
        return self

    def wrap(self, argv: Sequence[str], user: Optional[str] = None) -> List[str]:
        """``argv`` run in the root (as ``user`` if given), PATH set to the root's."""
        if self.holder is None:
            raise SlurmRootError("the root is not started")
        spec = []
        if user is not None:
            self.add_user(user)
            pw = pwd.getpwnam(user)
            spec = [f"--userspec={pw.pw_uid}:{pw.pw_gid}", f"--groups={pw.pw_gid}"]
        nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"  # the caller may pass no PATH
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        return [nsenter, f"--target={self.holder.pid}", "--mount", "--", chroot, *spec,
                str(self.path), "/usr/bin/env", f"PATH={ROOT_PATH}", *argv]

    def stop(self) -> None:
        holder, self.holder = self.holder, None
        if holder is not None:
            with contextlib.suppress(OSError):
                if holder.stdin:
                    holder.stdin.close()
            try:
                holder.wait(10)
            except subprocess.TimeoutExpired:
                holder.kill()  # our own child, by its Popen
                holder.wait(5)
        shutil.rmtree(self.client_dir, ignore_errors=True)

    def mps_health(self) -> List[str]:
        """The installed ``mps-health`` of the root, as a command for this machine."""
        return self.wrap([f"{VENV}/bin/mps-health"])

    @property
    def python(self) -> str:
        """The root's Python with mps-health (a path inside the root)."""
        return f"{VENV}/bin/python3"


def mps_health_argv(root: Optional[SlurmRoot]) -> List[str]:
    """mps-health as a node has it: the root's install, or this checkout's."""
    return root.mps_health() if root is not None else argv("mps-health")


def make_root(dest: Path, cache: Path) -> SlurmRoot:
    """Unpack a fresh Debian 13 root at ``dest`` and install mps-health in it."""
    from debian_root import fresh_root

    fresh_root(dest, PACKAGES)
    root = SlurmRoot(dest)
    root.install_mps_health(cache)
    return root


def remove_root(root: SlurmRoot) -> None:
    root.stop()
    if os.path.isdir(root.path):
        shutil.rmtree(root.path, ignore_errors=True)
