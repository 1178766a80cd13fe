"""Test helpers for the per-job hooks: a private "site" (parent dir, config, installed hooks).

A site is a root-owned sticky dir under /tmp standing in for /tmp itself, a config
with the per-job layout pointing there and at the fake control binary, and the three
hook scripts written by ``mps-health slurm install``. The hooks run with the
environment slurmd was seen to give them (tests/fixtures/slurm_hook_env__*), as root
or as the test user. Teardown ends, by PID verified in /proc, any MPS process whose
environment names the site, and removes it.
"""

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from clirun import argv
from paths import FAKE_CONTROL, FIXTURES, REPO

MAPPED = ("checks", "exporters", "remediation", "slurm")


def fixture_env(name: str, **overrides: str) -> Dict[str, str]:
    """A captured hook environment (tests/fixtures/slurm_hook_env__NAME.txt) as a dict."""
    env: Dict[str, str] = {}
    for line in (FIXTURES / f"slurm_hook_env__{name}.txt").read_text().splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        env[key] = value
    env.update(overrides)
    return env


def as_user_kwargs(user: Optional[str]) -> dict:
    if user is None:
        return {}
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def user_python(base: Path, user: str) -> Optional[str]:
    """An interpreter ``user`` can run that imports this checkout's mps_health.

    sys.executable when the user can run it (CI); else a venv of /usr/bin/python3 whose
    .pth points at a symlinked mps_health tree (here the venv's Python lives under
    /root, which other users cannot enter). None when neither works.
    """
    probe = ["-I", "-c", "import mps_health.slurm.hooks, mps_health.config"]
    try:
        r = subprocess.run([sys.executable, *probe], capture_output=True, timeout=60,
                           **as_user_kwargs(user))
        if r.returncode == 0:
            return sys.executable
    except OSError:
        pass  # the user cannot even start it
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        return None
    venv = base / "py"
    subprocess.run([system, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=120)
    site = base / "site" / "mps_health"
    site.mkdir(parents=True)
    for entry in (REPO / "core").iterdir():
        if entry.name != "__pycache__":
            (site / entry.name).symlink_to(entry)
    for name in MAPPED:
        (site / name).symlink_to(REPO / name)
    [packages] = venv.glob("lib/python3*/site-packages")
    (packages / "mps_health_checkout.pth").write_text(str(base / "site") + "\n")
    for path in (venv, base / "site"):
        subprocess.run(["chmod", "-R", "o+rX", str(path)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    r = subprocess.run([python, *probe], capture_output=True, timeout=60, **as_user_kwargs(user))
    return python if r.returncode == 0 else None


class Site:
    """A parent dir standing in for /tmp, a per-job config, and the installed hooks."""

    def __init__(self, user: str, python: str, extra_config: str = "",
                 pipe: str = "nvidia-mps_job{job}", log: str = "nvidia-log_job{job}",
                 control: str = FAKE_CONTROL,
                 mps_health: Sequence[str] = tuple(argv("mps-health"))) -> None:
        self.user = user
        self.python = python
        self.pw = pwd.getpwnam(user)
        self.base = Path(tempfile.mkdtemp(prefix="mpsh-site-", dir="/tmp"))
        self.base.chmod(0o755)
        self.parent = self.base / "tmp"
        self.parent.mkdir()
        self.parent.chmod(0o1777)  # like /tmp: sticky, everyone may create
        self.hooks = self.base / "hooks"
        self.hooks.mkdir()
        self.config = self.base / "config.yaml"
        self.config.write_text(f"""
run_dir: {self.base}/run
state_dir: {self.base}/state
mps:
  layout: per-job
  pipe_dir: {self.parent}/{pipe}
  log_dir: {self.parent}/{log}
  dir_mode: '0700'
commands:
  nvidia-cuda-mps-control: {control}
  squeue: {self.base}/squeue
jobs:
  start_timeout_s: 10
  quit_timeout_s: 2
  kill_grace_s: 1
{extra_config}
""")
        self.config.chmod(0o644)
        self.slurm_runs()  # Slurm's view of the node: no job yet
        # Installed by the mps-health that will run them (a Slurm root's has its own).
        self.mps_health = list(mps_health)
        r = subprocess.run([*self.mps_health, "slurm", "install", "--prefix", str(self.hooks),
                            "--config", str(self.config), "--python", python],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"mps-health slurm install failed: {r.stderr}")
        self.install_output = r.stdout

    def slurm_runs(self, *jobs: str) -> None:
        """What squeue says runs on this node: ``jobs``, each of this site's user."""
        from hostile import fake_squeue, squeue_line

        fake_squeue(self.base, [squeue_line(j, self.user) for j in jobs])

    def env(self, hook: str, job: str, label: str = "mps-50", **overrides: str
            ) -> Dict[str, str]:
        """slurmd's environment for ``hook`` of job ``job`` (as captured on Slurm 22.05)."""
        uid, gid = str(self.pw.pw_uid), str(self.pw.pw_gid)
        env = fixture_env(f"slurm-22.05_{hook.replace('-', '_')}_{label}", SLURM_JOB_ID=job,
                          SLURM_JOBID=job, SLURM_JOB_UID=uid, SLURM_UID=uid,
                          SLURM_JOB_GID=gid, SLURM_JOB_USER=self.user)
        if hook != "task-prolog":
            env.pop("PATH", None)  # slurmd gives the Prolog and Epilog none
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}

    def run(self, hook: str, env: Dict[str, str], as_user: bool = False,
            timeout: float = 60) -> subprocess.CompletedProcess:
        script = self.hooks / f"mps-health-{hook}"
        return subprocess.run([str(script)], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd="/",
                              **as_user_kwargs(self.user if as_user else None))

    def pipe_dir(self, job: str, gpu: str = "") -> Path:
        text = self.config.read_text()
        line = next(x for x in text.splitlines() if x.strip().startswith("pipe_dir:"))
        return Path(line.split(":", 1)[1].strip().format(job=job, gpu=gpu))

    def entries(self) -> List[str]:
        return sorted(os.listdir(self.parent))

    def processes(self) -> List[int]:
        """Live PIDs whose environment names a path in this site (MPS daemons and servers)."""
        marker = f"={self.parent}/".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and any(e.startswith(b"CUDA_MPS_PIPE_DIRECTORY") and marker in e
                                    for e in env):
                found.append(int(name))
        return sorted(found)

    def close(self) -> None:
        for pid in self.processes():  # each found by its environment just now
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.base, ignore_errors=True)


def proc_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def daemon_pid(pipe_dir: Path) -> Optional[int]:
    try:
        text = (pipe_dir / "nvidia-cuda-mps-control.pid").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
