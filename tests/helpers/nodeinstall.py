"""Helpers for the node-install tests: the README's blocks, a wheel folder for the Debian 13
root's Python, and commands run in the root as root, a job user or nagios."""

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from debian_root import chroot_argv
from paths import REPO

README = REPO / "README.md"
# The Python of Debian 13's python3 package: the wheels of compiled dependencies must match.
ROOT_PYTHON = "3.13"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def readme_block(name: str) -> str:
    """The shell block after ``<!-- block: NAME -->`` in README.md, as written there."""
    m = re.search(rf"<!-- block: {re.escape(name)} -->\n```sh\n(.*?)```\n", README.read_text(),
                  re.S)
    assert m, f"README.md has no block {name!r}"
    return m.group(1)


def run(argv: Sequence[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    print(f"$ {' '.join(argv)[-300:]}\n(rc {r.returncode})\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(dest)  # our own sdist, built in this session
    [src] = [p for p in dest.iterdir() if p.is_dir()]
    return src


def make_wheelhouse(src: Path, python_version: str = ROOT_PYTHON) -> Path:
    """The README's wheelhouse block, run in an unpacked source tree; skips without PyPI."""
    env = dict(os.environ, NODE_PYTHON=python_version)
    r = run(["sh", "-ec", readme_block("wheelhouse")], cwd=src, env=env, timeout=600)
    if r.returncode != 0 and re.search(r"No matching distribution|Could not find a version|"
                                       r"NewConnectionError|Network is unreachable|"
                                       r"Temporary failure in name resolution", r.stderr):
        pytest.skip("the dependencies' wheels cannot be downloaded here (no PyPI): "
                    + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr[-3000:]
    return src / "wheels"


def bumped_wheel(src: Path, version: str, dest: Path) -> Path:
    """mps-health's wheel with another version number (an upgrade to install)."""
    copy = dest / f"src-{version}"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("wheels", "build", "*.egg-info"))
    for name in ("pyproject.toml", "__init__.py"):
        path = copy / name
        text = path.read_text()
        assert '"0.1.0"' in text
        path.write_text(text.replace('"0.1.0"', f'"{version}"', 1))
    out = dest / f"wheels-{version}"
    r = run(["python3", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(copy)],
            timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    [wheel] = out.glob("*.whl")
    return wheel


class Node:
    """A Debian 13 root standing for a fresh node; commands run in it as any user."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def sh(self, script: str, user: Optional[str] = None, env: Optional[Dict[str, str]] = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
        home = "/root" if user is None else f"/home/{user}"
        base = {"PATH": PATH if user is None else USER_PATH, "HOME": home, "LANG": "C.UTF-8",
                "USER": user or "root"}
        base.update(env or {})
        argv: List[str] = []
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        argv += ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in base.items()),
                 "/bin/sh", "-ec", script]
        return run(chroot_argv(self.root, argv), timeout=timeout)

    def ok(self, script: str, user: Optional[str] = None, **kw) -> str:
        r = self.sh(script, user, **kw)
        assert r.returncode == 0, (script, r.stdout[-2000:], r.stderr[-2000:])
        return r.stdout

    def add_users(self) -> None:
        """A job user (alice) and the monitoring user (nagios), as on a real node."""
        self.ok("useradd --create-home --shell /bin/sh alice\n"
                "useradd --system --no-create-home --shell /usr/sbin/nologin nagios")

    def uid(self, user: str) -> str:
        return self.ok(f"id -u {user}").strip()

    def files(self) -> Dict[str, str]:
        """Every path in the root but the scratch ones, with its type and mode."""
        found: Dict[str, str] = {}
        for here, dirs, names in os.walk(self.root):
            rel = "/" + os.path.relpath(here, self.root).lstrip(".")
            if rel.rstrip("/") in ("/proc", "/tmp", "/dev", "/sys"):
                dirs[:] = []
                continue
            for name in dirs + names:
                path = os.path.join(here, name)
                st = os.lstat(path)
                found[os.path.join(rel, name)] = f"{st.st_mode:o}"
        return found
