"""``mps-health slurm install``: the three hook scripts slurm.conf points at, for the
per-job layout only (the node and per-GPU layouts' daemons are systemd units: no hook).

Each is a four-line Python script (templates/hook.j2) naming the interpreter and the
config (slurmd gives hooks no PATH, no arguments); root's, mode 0755, written atomically.
A file there that we did not write is never replaced without ``--force``.
"""

import os
from typing import List, NamedTuple, Optional

from mps_health.slurm.render import HOOK_KEYS, hook_paths, render_hook

MARKER = "# mps-health Slurm "


class InstallError(Exception):
    """Why nothing (more) was installed, in one line."""


class Written(NamedTuple):
    hook: str
    path: str
    text: str


def plan(prefix: str, python: str, config: Optional[str]) -> List[Written]:
    return [Written(hook, path, render_hook(hook, python, config, path))
            for hook, path in hook_paths(prefix).items()]


def _ours(path: str, absent: bool = True) -> bool:
    """A regular file we wrote, or nothing there (``absent``); a link or anything else is
    not ours."""
    from mps_health.hostio.safefiles import read_small

    try:
        data = read_small(path)
    except OSError:
        return False
    return absent if data is None else MARKER in data[:512].decode("utf-8", "replace")


# Run by the interpreter the hooks will use: the dirs its mps_health (and the YAML
# loader the config needs) come from, one per line.
PROBE = ("import os, mps_health, mps_health.slurm.hooks as h\n"
         "print(os.path.dirname(mps_health.__file__)); print(os.path.dirname(h.__file__))\n"
         "try:\n import yaml; print(os.path.dirname(yaml.__file__))\n"
         "except ImportError: pass\n")
FOR_JOB_USERS = ("the TaskProlog runs as the job's user: install mps-health where every user "
                 "can read it (a venv in /opt/mps-health, see the README's Install on a node)")


def hooks_for(layout: str) -> bool:
    """Whether ``mps.layout`` needs the Prolog, TaskProlog and Epilog: per-job only (a
    hook of another layout would start nothing on every GPU job)."""
    return layout == "per-job"


def written_before(prefix: str) -> List[str]:
    """Hooks an earlier ``slurm install`` left under ``prefix`` (our regular files)."""
    return [path for path in hook_paths(prefix).values() if _ours(path, absent=False)]


def check_python(python: str) -> List[str]:
    """The interpreter must import the hooks as slurmd will run them (-I, no PATH);
    returns the package dirs it imports them from."""
    from mps_health.hostio.runas import run_as

    r = run_as([python, "-I", "-c", PROBE], 60, None, env={})
    if r.exec_error or r.rc != 0:
        said = r.exec_error or (r.stderr.strip().splitlines() or ["?"])[-1]
        raise InstallError(f"{python} cannot import mps_health.slurm.hooks ({said}): give "
                           "--python the interpreter mps-health is installed for")
    return [line for line in r.stdout.splitlines() if line.startswith("/")]


def check_job_users(python: str, packages: List[str], prefix: str,
                    config: Optional[str]) -> None:
    """Job users must reach the interpreter, the packages, the hooks and the config."""
    from mps_health.config.load import DEFAULT_PATH
    from mps_health.slurm import reach

    config = config or (DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None)
    for what, problem in (
            (f"the interpreter {python}", reach.usable(python, reach.EXECUTABLE)),
            ("the mps_health package", reach.package_tree(packages)),
            (f"the hook directory {prefix}", reach.usable(prefix, reach.SEARCHABLE)),
            (f"the config {config}", reach.usable(config, reach.READABLE) if config else "")):
        if problem:
            raise InstallError(f"job users cannot use {what}: {problem}; {FOR_JOB_USERS}")


def install(prefix: str, python: str, config: Optional[str], force: bool) -> List[Written]:
    if not os.path.isabs(prefix) or not os.path.isdir(prefix):
        raise InstallError(f"{prefix}: not an existing directory (give an absolute --prefix)")
    if config is not None and not os.path.isabs(config):
        raise InstallError(f"--config {config}: give an absolute path (hooks run from /)")
    check_job_users(python, check_python(python), prefix, config)
    scripts = plan(prefix, python, config)
    for w in scripts:
        if not force and not _ours(w.path):
            raise InstallError(f"{w.path} exists and was not written by mps-health: move it, "
                               "or use --force")
    from mps_health.hostio.safefiles import write_atomic

    for w in scripts:
        write_atomic(os.path.abspath(w.path), w.text.encode(), 0o755)
    return scripts


def conf_lines(scripts: List[Written]) -> str:
    return "".join(f"{HOOK_KEYS[w.hook]}={w.path}\n" for w in scripts)
