"""A real Debian 13 (trixie) root for tests: fresh installs and Slurm 24.11.

``debootstrap --variant=minbase trixie`` takes about half a minute; the packages on top
(python3 and python3-venv for the node install, slurm-wlm and munge for Slurm 24.11) a
minute or two more. So each root is built once and kept as a tarball in a cache folder
(``MPS_HEALTH_TEST_CACHE``, default ``~/.cache/mps-health-tests``), keyed by its package
list; every test session unpacks a fresh copy, so no test sees another's changes.

Commands run in the root through ``chroot_argv``: a private mount and PID namespace with
its own /proc, so nothing mounted there shows on the host and every process started in
it dies with the namespace's first process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import List, Sequence

import pytest

MIRROR = "http://deb.debian.org/debian"
SUITE = "trixie"
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "mps-health-tests"
    path = Path(os.environ.get("MPS_HEALTH_TEST_CACHE", str(default)))
    path.mkdir(parents=True, exist_ok=True)
    return path


def usable() -> str:
    """Why a Debian root cannot be built here, or '' when it can."""
    if os.geteuid() != 0:
        return "building a Debian root needs root"
    for tool in ("debootstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install debootstrap util-linux)"
    return ""


def chroot_argv(root: Path, argv: Sequence[str], pid_namespace: bool = True) -> List[str]:
    """``argv`` run inside ``root``, in private mount (and PID) namespaces with /proc."""
    ns = ["unshare", "--mount", "--propagation", "private"]
    if pid_namespace:
        ns += ["--pid", "--fork", f"--mount-proc={root}/proc"]
    return [*ns, "chroot", str(root), *argv]


def _run(argv: Sequence[str], timeout: float, what: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8",
               PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-2000:]
        raise RuntimeError(f"{what} failed (exit {r.returncode}):\n{tail}")


def _build(dest: Path, packages: Sequence[str]) -> None:
    _run(["debootstrap", "--variant=minbase", SUITE, str(dest), MIRROR], 900,
         "debootstrap --variant=minbase trixie")
    (dest / "etc/hosts").write_text(HOSTS)
    shutil.copy("/etc/resolv.conf", dest / "etc/resolv.conf")
    # Daemons must not start from maintainer scripts inside the root.
    policy = dest / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    if packages:
        _run(chroot_argv(dest, ["apt-get", "update", "-qq"]), 600, "apt-get update in the root")
        _run(chroot_argv(dest, ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                *packages]), 1200, f"apt-get install {' '.join(packages)}")
        _run(chroot_argv(dest, ["apt-get", "clean"]), 120, "apt-get clean")


def _key(packages: Sequence[str]) -> str:
    text = "\n".join([SUITE, MIRROR, *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_tarball(packages: Sequence[str]) -> Path:
    """The cached tarball of a trixie root with ``packages``, built on first use."""
    cache = cache_dir()
    tarball = cache / f"trixie-{_key(packages)}.tar"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions never build the same root twice
        if tarball.exists():
            return tarball
        work = cache / f"build-{_key(packages)}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            _build(work, packages)
            partial = tarball.with_suffix(".partial")
            with tarfile.open(partial, "w") as tar:
                tar.add(str(work), arcname=".")
            partial.rename(tarball)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tarball


def fresh_root(dest: Path, packages: Sequence[str]) -> Path:
    """A new copy of the trixie root with ``packages`` at ``dest``; skips when impossible."""
    why = usable()
    if why:
        pytest.skip(why)
    try:
        tarball = cached_tarball(packages)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"no Debian 13 root could be built here: {e}")
    dest.mkdir(parents=True, exist_ok=True)
    _run(["tar", "-xpf", str(tarball), "-C", str(dest)], 600, "unpacking the cached root")
    (dest / "etc/hosts").write_text(HOSTS)
    return dest
