"""config: defaults without a file, and one clear line for every bad key."""

import subprocess
import sys
from pathlib import Path

import pytest
from mps_health import config


def test_no_file_gives_seed_defaults_without_yaml() -> None:
    code = ("import sys; from mps_health import config; "
            "c = config.load(); print(c.mps.pipe_dir, c.mps.log_dir, oct(c.mps.dir_mode)); "
            "print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    if Path(config.DEFAULT_PATH).exists():
        pytest.skip("this machine has a real /etc/mps-health/config.yaml")
    assert out == ["/tmp/nvidia-mps", "/var/log/nvidia-mps", "0o777", "False"]


def test_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="no such file"):
        config.load(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("text,message", [
    ("mps: [1, 2]", "key 'mps': must be a mapping of keys"),
    ("mps:\n  layout: sideways", "key 'mps.layout': must be one of node, per-gpu, per-job"),
    ("mps:\n  dir_mode: rwx", "key 'mps.dir_mode': must be an octal mode"),
    ("mps:\n  pipe_dir: relative/path", "key 'mps.pipe_dir': must be an absolute path"),
    ("mps:\n  layout: per-job\n  pipe_dir: /tmp/x", "key 'mps.pipe_dir': per-job layout needs {job}"),
    ("mps:\n  layout: per-gpu\n  pipe_dir: /tmp/x", "key 'mps.pipe_dir': per-gpu layout needs {gpu}"),
    ("mps:\n  gpus: [true]", "key 'mps.gpus': must be a list of GPU indices"),
    ("control:\n  timeout_s: fast", "key 'control.timeout_s': must be a number"),
    ("control:\n  timeout_s: 0", "key 'control.timeout_s': must be between 0.1 and 60"),
    ("colour: blue", "key 'colour': unknown key"),
    ("mps:\n  pipedir: /tmp", "key 'mps.pipedir': unknown key"),
    ("- just\n- a list", "the top level must be a mapping"),
    ("mps: {layout: node", "not valid YAML"),
    ("tmpfiles:\n  require_guard: maybe", "key 'tmpfiles.require_guard': must be true or false"),
])
def test_bad_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load(str(path))
    assert str(e.value).startswith(str(path))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


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
