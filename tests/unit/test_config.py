"""config: defaults without a file, and one clear line for every bad key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRIPWIRE_DIR
from mps_health.config import load as config
from mps_health.engine import registry


def test_no_file_gives_the_defaults_without_yaml() -> None:
    code = ("import sys; from mps_health.config import load as config; "
            "c = config.load(table=None); print(c.mps.pipe_dir, c.mps.log_dir, oct(c.mps.dir_mode)); "
            "print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    if Path(config.DEFAULT_PATH).exists():
        pytest.skip("this machine has a real /etc/mps-health/config.yaml")
    assert out == ["/tmp/nvidia-mps", "/var/log/nvidia-mps", "0o777", "False"]


def test_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="no such file"):
        config.load(str(tmp_path / "nope.yaml"), table=None)


@pytest.mark.parametrize("text,message", [
    ("mps: [1, 2]", "key 'mps': must be a mapping of keys"),
    ("mps:\n  layout: sideways", "key 'mps.layout': must be one of node, per-gpu, per-job"),
    ("mps:\n  dir_mode: rwx", "key 'mps.dir_mode': must be an octal mode"),
    ("mps:\n  pipe_dir: relative/path", "key 'mps.pipe_dir': must be an absolute path"),
    ("mps:\n  layout: per-job\n  pipe_dir: /tmp/x", "key 'mps.pipe_dir': per-job layout needs {job}"),
    ("mps:\n  layout: per-gpu\n  pipe_dir: /tmp/x", "key 'mps.pipe_dir': per-gpu layout needs {gpu}"),
    ("mps:\n  gpus: [true]", "key 'mps.gpus': must be a list of GPU indices"),
    ("control:\n  timeout_s: fast", "key 'control.timeout_s': must be a number"),
    ("control:\n  timeout_s: 0", "key 'control.timeout_s': must be a number between 0.1 and 60"),
    ("colour: blue", "key 'colour': unknown section"),
    ("nagios:\n  warning: 1", "key 'nagios': unknown section"),
    # every section is validated whatever runs, including those only one command reads
    ("logs:\n  windw_s: 5", "key 'logs.windw_s': unknown key"),
    ("servers:\n  init_stuck_s: -1", "key 'servers.init_stuck_s': must be a number >= 0"),
    ("canary:\n  device: -1", "key 'canary.device': must be a whole number"),
    ("gpu:\n  compute_mode: {mps: SHARED}", "key 'gpu.compute_mode.mps': must be one of"),
    ("slurm:\n  output: xml", "key 'slurm.output': must be one of auto, text, json"),
    ("slurm:\n  drain_tag: NHC-MPS", "key 'slurm.drain_tag': must not start with NHC"),
    ("slurm:\n  drain_tag: two words", "key 'slurm.drain_tag': must be one word"),
    ("orphans:\n  min_age: 5", "key 'orphans.min_age': unknown key"),
    ("jobs:\n  start_for: all", "key 'jobs.start_for': must be one of mps, gpu"),
    ("healthcheck:\n  fail_runs: 0", "key 'healthcheck.fail_runs': must be a whole number"),
    ("remediation:\n  audit_log: log.txt", "key 'remediation.audit_log': must be an absolute"),
    ("exporter:\n  listen: 10102", "key 'exporter.listen': must be a non-empty string"),
    ("exporter:\n  listen: 'a:b'", "key 'exporter.listen': listen address 'a:b' is not HOST"),
    ("checks:\n  enable: [canry]", "key 'checks.enable': unknown check 'canry' (known: "),
    ("commands:\n  nvidia-smi: /usr/bin/nvidia-smi", "key 'commands.nvidia-smi': unknown program"),
    # one key per concept: the old twins are refused, naming the key to use
    ("healthcheck:\n  tag: 'X:'", "key 'healthcheck.tag': unknown key: it is slurm.drain_tag now"),
    ("healthcheck:\n  scontrol_timeout_s: 3",
     "key 'healthcheck.scontrol_timeout_s': unknown key: it is slurm.timeout_s now"),
    ("remediation:\n  orphan_min_age_s: 3",
     "key 'remediation.orphan_min_age_s': unknown key: it is orphans.min_age_s now"),
    ("slurm:\n  timeout_s: 30", "key 'healthcheck.timeout_s': must leave room for the checks "
     "and 3 scontrol calls: at least 3 x slurm.timeout_s + 2 = 92 (the default 45: set it, "
     "or lower slurm.timeout_s)"),
    ("slurm:\n  timeout_s: 30\nhealthcheck:\n  timeout_s: 50",
     "key 'healthcheck.timeout_s': must leave room for the checks and 3 scontrol calls: at "
     "least 3 x slurm.timeout_s + 2 = 92 (got 50)"),
    # control characters never reach a path or a command
    ("mps:\n  pipe_dir: \"/tmp/a\\nb\"", "key 'mps.pipe_dir': must be an absolute path without "
     "control characters (got '/tmp/a\\nb')"),
    ("state_dir: \"/var/lib/\\x1b[31m\"", "key 'state_dir': must be an absolute path"),
    ("commands:\n  scontrol: \"scontrol\\r\"", "key 'commands.scontrol': must be a program name"),
    ("jobs:\n  log_file: \"/var/log/j\\x7f\"", "key 'jobs.log_file': must be an absolute path"),
    ("mps:\n  layout: per-job\n  pipe_dir: /tmp/{job}/x",
     "key 'mps.pipe_dir': {job} and {gpu} may only appear in the last path component"),
    ("mps:\n  layout: per-job\n  pipe_dir: /tmp/mps_{job}_{user}", "key 'mps.pipe_dir': the "
     "per-job layout allows only {job}, {gpu}"),
    ("mps:\n  layout: per-gpu\n  pipe_dir: /tmp/mps_{gpu}_{job}", "allows only {gpu}"),
    ("mps:\n  pipedir: /tmp", "key 'mps.pipedir': unknown key"),
    ("- just\n- a list", "the top level must be a mapping"),
    ("mps: {layout: node", "not valid YAML"),
    ("tmpfiles:\n  require_guard: maybe", "key 'tmpfiles.require_guard': must be true or false"),
    ("mps:\n  binary_dirs: [bin]", "key 'mps.binary_dirs': must be an absolute path"),
    ("mps:\n  binary_dirs: []", "key 'mps.binary_dirs': must be a list of absolute dirs"),
])
def test_bad_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load(str(path), table=registry)
    assert str(e.value).startswith(str(path))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_quoted_values_are_cut_and_escaped(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("mps:\n  layout: \"" + "\\e[2J" * 500 + "\"\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(str(path), table=None)
    line = str(e.value)
    assert "\x1b" not in line and "\\x1b[2J" in line and line.endswith("...)")
    assert len(line) < len(str(path)) + 160


def test_unknown_key_names_are_cut_too() -> None:
    with pytest.raises(config.ConfigError) as e:
        config.from_mapping({"logs": {"x" * 5000: 1}}, "c.yaml")
    assert len(str(e.value)) < 300


def test_every_declared_section_loads_its_defaults() -> None:
    """The table names each section's owner, and its module declares it."""
    for name, owner in config.SECTIONS.items():
        assert name in {s.name for s in owner()}, f"{owner.__name__} does not declare {name}"
    full = config.from_mapping({name: {} for name in config.SECTIONS}, "c.yaml")
    assert set(full.sections) == set(config.SECTIONS)
    assert full.given == tuple(config.SECTIONS)


def test_a_file_imports_only_the_owners_of_the_sections_it_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's file of core keys loads no other module (a millisecond of every check);
    a section's owner is loaded with it, and slurm brings healthcheck, whose rules read
    it."""
    asked: list = []
    counted = {o: lambda o=o: asked.append(o.__name__) or o() for o in config.SECTIONS.values()}
    monkeypatch.setattr(config, "SECTIONS", {k: counted[o] for k, o in config.SECTIONS.items()})

    def loads(data: dict) -> list:
        asked.clear()
        config.from_mapping(data, "c.yaml")
        return sorted(asked)

    assert loads({"run_dir": "/run/x", "mps": {"layout": "node"}}) == []
    assert loads({"logs": {}}) == ["_deep_checks"]
    assert loads({"slurm": {}}) == ["_remediation", "_slurm"]
    c = config.from_mapping({"slurm": {}}, "c.yaml")
    assert sorted(c.sections) == ["gpu", "healthcheck", "orphans", "remediation", "slurm"]


def test_a_typo_in_any_section_fails_every_command(tmp_path: Path) -> None:
    """One line, exit 3, even where the command never reads the section."""
    path = tmp_path / "c.yaml"
    path.write_text("logs:\n  windw_s: 5\n")
    for argv in (["check", "--only", "daemon"], ["exporter", "--textfile", str(tmp_path)],
                 ["remediate", "reset", "node", "--dry-run"], ["slurm", "install", "--dry-run"]):
        done = subprocess.run([sys.executable, "-m", "mps_health.cli.main", *argv, "--config",
                               str(path)], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (3, ""), argv
        assert done.stderr == (f"mps-health: {path}: key 'logs.windw_s': unknown key (known "
                               "here: window_s, pending_warn_s, max_read_bytes)\n"), argv


def test_records_are_frozen_and_replaceable() -> None:
    c = config.from_mapping({"control": {"timeout_s": 3}}, None)
    with pytest.raises(AttributeError):
        c.control.timeout_s = 1.0  # type: ignore[misc]
    assert c.control._replace(timeout_s=1.0).timeout_s == 1.0 and c.control.timeout_s == 3.0


def test_layouts() -> None:
    c = config.from_mapping({"mps": {"layout": "per-gpu", "gpus": [0, "1"]}}, None)
    assert c.mps.pipe_dir == "/tmp/nvidia-mps_{gpu}" and c.mps.gpus == ("0", "1")
    j = config.from_mapping({"mps": {"layout": "per-job"}}, None)
    assert "{job}" in j.mps.pipe_dir and j.mps.daemon_user == "job"
    assert config.from_mapping({"mps": {"dir_mode": "0700"}}, None).mps.dir_mode == 0o700


def test_commands_are_configurable() -> None:
    c = config.from_mapping({"commands": {"nvidia-cuda-mps-control": "/opt/cuda/bin/x"}}, None)
    assert c.command("nvidia-cuda-mps-control") == "/opt/cuda/bin/x"
    assert c.command("scontrol") == "scontrol"


def test_the_host_state_tripwire_fires(tmp_path: Path) -> None:
    """tests/tripwire: a program the tests start that touches the host's state is named."""
    log = tmp_path / "touched.log"
    code = ("import contextlib\nwith contextlib.suppress(OSError): open('/var/lib/mps-health/x')\n"
            "with contextlib.suppress(OSError): open('/tmp/elsewhere-x')\n")
    env = dict(os.environ, MPS_HEALTH_TEST_TRIPWIRE=str(log),
               PYTHONPATH=str(TRIPWIRE_DIR))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    (line,) = log.read_text().splitlines()
    assert line.endswith(": open /var/lib/mps-health/x")


def test_libyaml_where_pyyaml_has_it_else_its_own_loader_with_the_same_bounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config is parsed on every run, by libyaml's safe loader where PyYAML was built
    with it and by PyYAML's SafeLoader otherwise: the same config, and the same refusals
    of a deep or alias-expanding file."""
    import yaml

    good, deep, bomb = tmp_path / "good.yaml", tmp_path / "deep.yaml", tmp_path / "bomb.yaml"
    good.write_text("budget_s: 7\nmps:\n  gpus: &g [0, 1]\ncontrol:\n  timeout_s: 1.5\n")
    deep.write_text("mps: " + "[" * 100 + "]" * 100 + "\n")
    bomb.write_text("a: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 6)))
    used = []
    real_load = yaml.load

    def load(text, Loader):  # PyYAML calls it with Loader=
        used.append(Loader)
        return real_load(text, Loader=Loader)

    monkeypatch.setattr(yaml, "load", load)

    def outcomes():
        loaded = config.load(str(good), table=None)
        refusals = []
        for path in (deep, bomb):
            with pytest.raises(config.ConfigError) as e:
                config.load(str(path), table=None)
            refusals.append(str(e.value))
        return loaded, refusals

    with_c = outcomes()
    assert used[0] is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert "nested more than 64 levels deep" in with_c[1][0]
    assert "more than 100000 values" in with_c[1][1]
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    used.clear()
    assert outcomes() == with_c
    assert used[0] is yaml.SafeLoader
