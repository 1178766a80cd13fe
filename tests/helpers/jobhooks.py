"""Test helpers for the per-job hooks on a site: parent dir, config, installed hooks.

The site (tests/helpers/nodesite.py) holds a root-owned sticky dir standing in for /tmp, a config
with the per-job layout pointing there and at the fake control binary, and the three
hook scripts written by ``mps-health slurm install``. The hooks run with the
environment slurmd was seen to give them (tests/fixtures/slurm_hook_env__*), as root
or as the test user. Teardown ends, by PID verified in /proc, any MPS process whose
environment names the site, and removes it.
"""

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from clirun import argv
from nodesite import Site
from paths import FAKE_CONTROL, FIXTURES, REPO


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
    .pth points at a link named mps_health to this checkout (here the venv's Python lives under
    /root, which other users cannot enter). None when neither works.
    """
    probe = ["-I", "-c", "import mps_health.slurm.hooks, mps_health.config.load"]
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
    site = base / "site"
    site.mkdir(parents=True)
    (site / "mps_health").symlink_to(REPO)  # the checkout root is the package
    [packages] = venv.glob("lib/python3*/site-packages")
    (packages / "mps_health_checkout.pth").write_text(str(base / "site") + "\n")
    for path in (venv, base / "site"):
        subprocess.run(["chmod", "-R", "o+rX", str(path)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    r = subprocess.run([python, *probe], capture_output=True, timeout=60, **as_user_kwargs(user))
    return python if r.returncode == 0 else None


class JobHooks:
    """The per-job layout on a site (tests/helpers/nodesite.py): a parent dir standing in for /tmp,
    a per-job config, Slurm's job list, and the hooks installed by ``mps-health slurm
    install``; ``jobs`` adds to the config's jobs section. Closing closes the site (a
    fresh one unless given)."""

    def __init__(self, user: str, python: str, jobs: Mapping[str, Any] = {},
                 pipe: str = "nvidia-mps_job{job}", log: str = "nvidia-log_job{job}",
                 control: str = FAKE_CONTROL,
                 mps_health: Sequence[str] = tuple(argv("mps-health")),
                 site: Optional[Site] = None) -> None:
        self.user = user
        self.python = python
        self.pw = pwd.getpwnam(user)
        self.site = site or Site.create()
        self.base = self.site.root
        self.parent = self.site.sticky_tmp()
        self.hooks = self.base / "hooks"
        self.hooks.mkdir()
        self.pipe_template, self.log_template = f"{self.parent}/{pipe}", f"{self.parent}/{log}"
        self.settings = {
            "mps": {"layout": "per-job", "dir_mode": "0700"},
            "commands": {"nvidia-cuda-mps-control": control, "squeue": f"{self.base}/squeue"},
            "jobs": {"start_timeout_s": 10, "quit_timeout_s": 2, "kill_grace_s": 1, **jobs}}
        self.config = Path(self.configure())
        self.slurm_runs()  # Slurm's view of the node: no job yet
        # Installed by the mps-health that will run them (a Slurm root's has its own).
        self.mps_health = list(mps_health)
        r = subprocess.run([*self.mps_health, "slurm", "install", "--prefix", str(self.hooks),
                            "--config", str(self.config), "--python", python],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"mps-health slurm install failed: {r.stderr}")
        self.install_output = r.stdout

    def configure(self, **sections: Any) -> str:
        """(Re)write the config, which the hooks read at each run: this layout with
        ``sections`` merged over it."""
        return self.site.config(self.settings, pipe=self.pipe_template, log=self.log_template,
                                **sections)

    def slurm_runs(self, *jobs: str) -> None:
        """What squeue says runs on this node: ``jobs``, each of this site's user."""
        from hostile import squeue_line

        self.site.squeue(*(squeue_line(j, self.user) for j in jobs))

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
        return Path(self.pipe_template.format(job=job, gpu=gpu))

    def entries(self) -> List[str]:
        return sorted(os.listdir(self.parent))

    def processes(self) -> List[int]:
        """Live PIDs whose CUDA_MPS_PIPE_DIRECTORY lies in this site (daemons, servers)."""
        return self.site.processes()

    def close(self) -> None:
        self.site.close()


def hooks_for_slurm(slurm_user: str, slurm_where: Any) -> Iterator[JobHooks]:
    """The hooks for a real Slurm's jobs (the host's, or the Debian 13 root's when
    ``slurm_where`` is one), run with a Python ``slurm_user`` can run that imports this
    checkout's mps_health: the body of the Slurm tests' module fixture. Skips without one."""
    import tempfile

    import pytest
    from slurmroot import mps_health_argv

    base = Path(tempfile.mkdtemp(prefix="mpsh-userpy-", dir="/tmp"))
    base.chmod(0o755)
    python = user_python(base, slurm_user) if slurm_where is None else slurm_where.python
    if python is None:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no Python that {slurm_user} can run imports this checkout's mps_health")
    s = JobHooks(slurm_user, python, mps_health=mps_health_argv(slurm_where))
    try:
        yield s
    finally:
        s.close()
        shutil.rmtree(base, ignore_errors=True)


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
