"""`mps-health slurm install` and the `jobs` config section."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mps_health.config import ConfigError, from_mapping
from mps_health.slurm.settings import JobsSettings, jobs_settings


def mps_health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mps_health.cli", *args], capture_output=True,
                          text=True, timeout=120)


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


def test_install_writes_three_scripts_and_the_conf_lines(tmp_path: Path,
                                                         tmp_path_factory) -> None:
    config = tmp_path_factory.mktemp("etc") / "x.yaml"
    config.write_text("mps:\n  layout: per-job\n")
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--config", str(config))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["mps-health-epilog", "mps-health-prolog", "mps-health-task-prolog"]
    for name in names:
        st = os.stat(tmp_path / name)
        assert (st.st_mode & 0o7777, st.st_uid) == (0o755, os.geteuid())
    prolog = (tmp_path / "mps-health-prolog").read_text()
    assert prolog.startswith(f"#!{sys.executable} -I\n")
    assert f"sys.exit(main('prolog', '{config}'))" in prolog
    assert r.stdout.splitlines()[-3:] == [f"Prolog={tmp_path}/mps-health-prolog",
                                          f"TaskProlog={tmp_path}/mps-health-task-prolog",
                                          f"Epilog={tmp_path}/mps-health-epilog"]
    again = mps_health("slurm", "install", "--prefix", str(tmp_path))  # ours: replaced
    assert again.returncode == 0 and "main('prolog', None)" in (
        tmp_path / "mps-health-prolog").read_text()


def test_install_never_replaces_a_file_it_did_not_write(tmp_path: Path) -> None:
    theirs = tmp_path / "mps-health-epilog"
    theirs.write_text("#!/bin/sh\n# the site's own epilog\n")
    r = mps_health("slurm", "install", "--prefix", str(tmp_path))
    assert r.returncode == 3
    assert r.stderr.strip() == (f"mps-health: install: {theirs} exists and was not written by "
                                "mps-health: move it, or use --force")
    assert theirs.read_text() == "#!/bin/sh\n# the site's own epilog\n"
    assert not (tmp_path / "mps-health-prolog").exists()  # all or nothing
    link = tmp_path / "mps-health-prolog"
    link.symlink_to(tmp_path / "elsewhere")
    theirs.unlink()
    r = mps_health("slurm", "install", "--prefix", str(tmp_path))
    assert r.returncode == 3 and f"{link} exists and was not written" in r.stderr
    forced = mps_health("slurm", "install", "--prefix", str(tmp_path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert not link.is_symlink() and not (tmp_path / "elsewhere").exists()


def test_install_checks_the_interpreter_and_the_prefix(tmp_path: Path) -> None:
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--python", "/usr/bin/false")
    assert r.returncode == 3
    assert "/usr/bin/false cannot import mps_health.slurm.hooks" in r.stderr
    r = mps_health("slurm", "install", "--prefix", str(tmp_path / "missing"))
    assert r.returncode == 3 and "not an existing directory" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--dry-run")
    assert r.returncode == 0 and r.stdout.count("==> ") == 3
    assert list(tmp_path.iterdir()) == []


def test_slurm_without_subcommand_is_usage() -> None:
    r = mps_health("slurm")
    assert r.returncode == 3 and "gres-conf" in r.stdout


def test_install_refuses_a_bad_config(tmp_path: Path, tmp_path_factory) -> None:
    config = tmp_path_factory.mktemp("etc") / "x.yaml"
    config.write_text("jobs:\n  start_for: sometimes\nmps:\n  layout: per-job\n")
    r = mps_health("slurm", "install", "--prefix", str(tmp_path), "--config", str(config))
    assert r.returncode == 3 and "key 'jobs.start_for'" in r.stderr
    assert list(tmp_path.iterdir()) == []
