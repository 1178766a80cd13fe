"""`mps-health slurm install` and the `jobs` config section."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from clirun import mps_health
from conftest import FIXTURES, REPO
from jobhooks import user_python
from mps_health.config.jobs import JobsSettings, jobs_settings
from mps_health.config.load import ConfigError, from_mapping

NOBODY = "nobody"


@pytest.fixture
def public() -> Iterator[Path]:
    """A dir every user can enter (pytest's own tmp dirs are root's, mode 0700)."""
    base = Path(tempfile.mkdtemp(prefix="mpsh-install-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def per_job() -> Iterator[str]:
    """A per-job config every user may read: the only layout Slurm runs our hooks for."""
    etc = Path(tempfile.mkdtemp(prefix="mpsh-etc-", dir="/tmp"))
    etc.chmod(0o755)
    config = etc / "per-job.yaml"
    config.write_text("mps:\n  layout: per-job\n")
    config.chmod(0o644)
    try:
        yield str(config)
    finally:
        shutil.rmtree(etc, ignore_errors=True)


@pytest.fixture(scope="module")
def python() -> Iterator[str]:
    """An interpreter job users can run that imports this checkout (sys.executable in CI;
    here a venv of /usr/bin/python3, since this machine's Python lives under /root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to try the interpreter as another user)")
    base = Path(tempfile.mkdtemp(prefix="mpsh-py-", dir="/tmp"))
    base.chmod(0o755)
    try:
        found = user_python(base, NOBODY)
        if found is None:
            pytest.skip(f"no interpreter {NOBODY} can run imports mps_health here")
        yield found
    finally:
        shutil.rmtree(base, ignore_errors=True)


def settings(data: dict) -> JobsSettings:
    return jobs_settings(from_mapping(data, "site.yaml"))


def test_defaults() -> None:
    assert settings({"mps": {"layout": "per-job"}}) == JobsSettings()


@pytest.mark.parametrize("data, message", [
    ({"jobs": {"start_timeout": 3}}, "key 'jobs.start_timeout': unknown key"),
    ({"jobs": {"start_for": "all"}}, "key 'jobs.start_for': must be one of mps, gpu"),
    ({"jobs": {"quit_timeout_s": -1}}, "key 'jobs.quit_timeout_s': must be a number between"),
    ({"jobs": {"on_start_failure": "drain"}}, "must be one of fail, continue"),
    ({"jobs": {"log_file": "relative.log"}}, "key 'jobs.log_file': must be an absolute path"),
    ({"jobs": ["start_for"]}, "key 'jobs': must be a mapping"),
    ({"mps": {"layout": "per-job", "pipe_dir": "/tmp/job{job}/mps", "log_dir": "/tmp/l{job}"}},
     "key 'mps.pipe_dir': {job} and {gpu} may only appear in the last path component"),
    ({"mps": {"layout": "per-job", "pipe_dir": "/tmp/mps{job}_{gpu}", "log_dir": "/tmp/l{job}"}},
     "key 'mps.log_dir': needs {gpu} too"),
    ({"mps": {"layout": "per-job", "pipe_dir": "/tmp/mps{job}_{host}", "log_dir": "/tmp/l{job}"}},
     "key 'mps.pipe_dir': the per-job layout allows only {job}, {gpu} (got "),
    ({"mps": {"layout": "per-job", "pipe_dir": "/tmp/" + "x" * 80 + "{job}",
              "log_dir": "/tmp/l{job}"}}, "key 'mps.pipe_dir': too long for a unix socket path"),
])
def test_bad_settings_are_one_line(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        settings(data)
    assert str(e.value).startswith("site.yaml: key '") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_install_writes_three_scripts_and_the_conf_lines(public: Path, python: str) -> None:
    hooks, config = public / "hooks", public / "x.yaml"
    hooks.mkdir()
    config.write_text("mps:\n  layout: per-job\n")
    r = mps_health("slurm", "install", "--prefix", str(hooks), "--config", str(config),
                   "--python", python)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in hooks.iterdir())
    assert names == ["mps-health-epilog", "mps-health-prolog", "mps-health-task-prolog"]
    for name in names:
        st = os.stat(hooks / name)
        assert (st.st_mode & 0o7777, st.st_uid) == (0o755, os.geteuid())
    prolog = (hooks / "mps-health-prolog").read_text()
    assert prolog.startswith(f"#!{python} -I\n")
    assert f"sys.exit(main('prolog', '{config}'))" in prolog
    assert r.stdout.splitlines()[-3:] == [f"Prolog={hooks}/mps-health-prolog",
                                          f"TaskProlog={hooks}/mps-health-task-prolog",
                                          f"Epilog={hooks}/mps-health-epilog"]
    # Without --config (and no default file here: the node layout) nothing is written;
    # a hook made for no config file (as the packages make them) reads the default one.
    again = mps_health("slurm", "install", "--prefix", str(hooks), "--python", python)
    assert again.returncode == 0 and "wrote nothing" in again.stdout
    assert (hooks / "mps-health-prolog").read_text() == prolog
    from mps_health.slurm.install import plan

    assert "main('prolog', None)" in plan(str(hooks), python, None)[0].text
    # The hooks really run as a job user: a job without GPUs returns at once.
    pw = __import__("pwd").getpwnam(NOBODY)
    for name in names:
        ran = subprocess.run([str(hooks / name)], env={}, capture_output=True, text=True,
                             timeout=60, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        assert ran.returncode == 0, (name, ran.stderr)


def test_install_never_replaces_a_file_it_did_not_write(public: Path, python: str,
                                                        per_job: str) -> None:
    theirs = public / "mps-health-epilog"
    theirs.write_text("#!/bin/sh\n# the site's own epilog\n")
    r = mps_health("slurm", "install", "--prefix", str(public), "--python", python,
                   "--config", per_job)
    assert r.returncode == 3
    assert r.stderr.strip() == (f"mps-health: install: {theirs} exists and was not written by "
                                "mps-health: move it, or use --force")
    assert theirs.read_text() == "#!/bin/sh\n# the site's own epilog\n"
    assert not (public / "mps-health-prolog").exists()  # all or nothing
    link = public / "mps-health-prolog"
    link.symlink_to(public / "elsewhere")
    theirs.unlink()
    r = mps_health("slurm", "install", "--prefix", str(public), "--python", python,
                   "--config", per_job)
    assert r.returncode == 3 and f"{link} exists and was not written" in r.stderr
    forced = mps_health("slurm", "install", "--prefix", str(public), "--force",
                        "--python", python, "--config", per_job)
    assert forced.returncode == 0, forced.stderr
    assert not link.is_symlink() and not (public / "elsewhere").exists()


def test_install_checks_the_interpreter_and_the_prefix(tmp_path: Path, per_job: str) -> None:
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--python", "/usr/bin/false",
                   "--config", per_job)
    assert r.returncode == 3
    assert "/usr/bin/false cannot import mps_health.slurm.hooks" in r.stderr
    r = mps_health("slurm", "install", "--prefix", str(tmp_path / "missing"), "--config",
                   per_job)
    assert r.returncode == 3 and "not an existing directory" in r.stderr
    assert list(tmp_path.iterdir()) == []


def _refused(r: subprocess.CompletedProcess, what: str, why: str) -> None:
    assert r.returncode == 3, r
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"mps-health: install: job users cannot use {what}: {why}; "
                               "the TaskProlog runs as the job's user: install mps-health "
                               "where every user can read it"), r.stderr


def test_install_refuses_what_job_users_cannot_use(public: Path, python: str,
                                                   per_job: str) -> None:
    """A private dir above the interpreter, the hooks or the config; a config only root
    may read: one line saying which path and why, and nothing written."""
    hooks = public / "hooks"
    hooks.mkdir()
    private = public / "private"
    private.mkdir(mode=0o700)
    # The interpreter's whole venv seen through a private dir: a venv under /root.
    os.symlink(Path(python).parent.parent, private / "venv")
    hidden_python = private / "venv" / "bin" / Path(python).name
    r = mps_health("slurm", "install", "--prefix", str(hooks), "--python", str(hidden_python),
                   "--config", per_job)
    _refused(r, f"the interpreter {hidden_python}", f"{private} is mode 0700")
    hidden = private / "hooks"
    hidden.mkdir()
    r = mps_health("slurm", "install", "--prefix", str(hidden), "--python", python,
                   "--config", per_job)
    _refused(r, f"the hook directory {hidden}", f"{private} is mode 0700")
    config = public / "config.yaml"
    config.write_text("mps:\n  layout: per-job\n")
    config.chmod(0o600)
    r = mps_health("slurm", "install", "--prefix", str(hooks), "--python", python,
                   "--config", str(config))
    _refused(r, f"the config {config}",
             f"{config} is mode 0600 (not readable by others)")
    assert list(hooks.iterdir()) == [] and list(hidden.iterdir()) == []


def test_install_refuses_a_package_job_users_cannot_read(public: Path, per_job: str) -> None:
    """An interpreter others may run whose mps_health others cannot read (a root umask
    of 077 at install time)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no /usr/bin/python3")
    venv = public / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=120)
    [site] = venv.glob("lib/python3*/site-packages")
    pkg = site / "mps_health"
    repo = REPO
    pkg.mkdir()
    shutil.copy(repo / "__init__.py", pkg)
    for init in repo.glob("*/__init__.py"):
        if init.parent.name != "tests":
            shutil.copytree(init.parent, pkg / init.parent.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "o+rX", str(venv)], check=True)
    (pkg / "slurm" / "hooks.py").chmod(0o600)
    hooks = public / "hooks"
    hooks.mkdir()
    r = mps_health("slurm", "install", "--prefix", str(hooks), "--python",
                   str(venv / "bin" / "python"), "--config", per_job)
    _refused(r, "the mps_health package",
             f"{pkg}/slurm/hooks.py is mode 0600 (not readable by others)")
    assert list(hooks.iterdir()) == []


def test_dry_run_writes_nothing(tmp_path: Path, per_job: str) -> None:
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--dry-run", "--config",
                   per_job)
    assert r.returncode == 0 and r.stdout.count("==> ") == 3
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("layout", ["node", "per-gpu"])
def test_install_for_a_node_layout_writes_no_hook(tmp_path: Path, tmp_path_factory,
                                                  layout: str) -> None:
    """The node's own daemons need no Prolog, TaskProlog or Epilog (each GPU job would log
    that the per-job prolog starts nothing): none is written, and the one slurm.conf line
    said is the health check's, as `slurm conf` gives it."""
    config = tmp_path_factory.mktemp("etc") / "node.yaml"
    config.write_text(f"mps:\n  layout: {layout}\n")
    for extra in ((), ("--dry-run",)):
        r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--config", str(config),
                       *extra)
        assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == (f"mps.layout is {layout}: its MPS daemons are the node's (systemd "
                            "units), not the jobs', so Slurm needs no Prolog, TaskProlog or "
                            "Epilog of mps-health: wrote nothing")
        assert "wrote " + str(tmp_path) not in r.stdout and "==> " not in r.stdout
        assert not any(line.startswith(("Prolog=", "TaskProlog=", "Epilog="))
                       for line in lines)
        assert list(tmp_path.iterdir()) == []
        conf = mps_health("slurm", "conf", "--config", str(config), "--nvml-record",
                          str(FIXTURES / "nvml__cpu-vm_no-driver.json"))
        assert conf.returncode == 0, conf.stderr
        [program] = [x for x in conf.stdout.splitlines() if x.startswith("HealthCheckProgram=")]
        assert lines[-1] == program
        assert "Prolog=" not in conf.stdout.replace("# No Prolog/", "")


def test_install_for_the_node_layout_names_hooks_left_from_before(tmp_path: Path,
                                                                   tmp_path_factory) -> None:
    """Hooks an earlier install wrote stay (slurm.conf may still name them: removing them
    would fail every job's Prolog) and are named with what to do; a site's own file at
    such a name is not ours to mention."""
    from mps_health.slurm.install import plan

    for w in plan(str(tmp_path), "/usr/bin/python3", None)[:2]:
        Path(w.path).write_text(w.text)
    (tmp_path / "mps-health-epilog").write_text("#!/bin/sh\n# the site's own\n")
    config = tmp_path_factory.mktemp("etc") / "node.yaml"
    config.write_text("mps:\n  layout: node\n")
    before = sorted((p.name, p.read_text()) for p in tmp_path.iterdir())
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--config", str(config))
    assert r.returncode == 0, r.stderr
    notes = [x for x in r.stdout.splitlines() if x.startswith("note: ")]
    assert notes == [f"note: {tmp_path}/{name} is from an earlier `mps-health slurm install`: "
                     "take its line out of slurm.conf (`scontrol reconfigure`), then remove it"
                     for name in ("mps-health-prolog", "mps-health-task-prolog")]
    assert sorted((p.name, p.read_text()) for p in tmp_path.iterdir()) == before


def test_slurm_without_subcommand_is_usage() -> None:
    r = mps_health("slurm")
    assert r.returncode == 3 and "gres-conf" in r.stdout


def test_install_refuses_a_bad_config(tmp_path: Path, tmp_path_factory) -> None:
    config = tmp_path_factory.mktemp("etc") / "x.yaml"
    config.write_text("jobs:\n  start_for: sometimes\nmps:\n  layout: per-job\n")
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--config", str(config))
    assert r.returncode == 3 and "key 'jobs.start_for'" in r.stderr
    assert list(tmp_path.iterdir()) == []
