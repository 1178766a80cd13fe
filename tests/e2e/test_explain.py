"""``mps-health explain [CODE]`` and ``mps-health config example``: the runbook and the
example config on the node, from what the package carries."""

import yaml
from clirun import mps_health
from conftest import REPO
from mps_health.cli.explain import declared
from mps_health.config.load import load
from mps_health.engine import registry
from mps_health.model.runbook import entries


def test_explain_lists_every_code_one_line_each() -> None:
    r = mps_health("explain")
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert len(listed) == len(r.stdout.splitlines())  # one line per code
    missing = sorted(set(declared()) - set(listed))
    assert missing == [], missing
    assert "run-overrun" in listed and "metrics-stale" in listed  # the other entries too
    # Every name 'explain CODE' knows is listed, a check's heading over its codes too.
    assert set(listed) == set(entries()), sorted(set(entries()) ^ set(listed))
    assert "servers" in listed and "gres-drift" in listed
    assert "CRITICAL" in listed["server-fault"]


def test_explain_prints_the_readmes_entry() -> None:
    r = mps_health("explain", "daemon-stale")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("daemon-stale\n")
    assert "CUDA clients pointed at a stale dir silently" in r.stdout
    row = mps_health("explain", "server-fault")
    assert row.returncode == 0 and row.stdout.startswith("server-fault (servers check): CRITICAL")
    assert "What to do: Let the listed clients end" in row.stdout
    both = mps_health("explain", "log-dir-symlink")
    assert both.stdout.startswith("pipe-dir-symlink / log-dir-symlink\n")


def test_an_unknown_code_is_one_line_and_exit_3() -> None:
    r = mps_health("explain", "daemon-stal")
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert "no runbook entry for 'daemon-stal' (did you mean daemon-stale?)" in r.stderr
    odd = mps_health("explain", "x\x1b[2Jy")
    assert odd.returncode == 3 and "\x1b" not in odd.stderr and "\\x1b" in odd.stderr


def test_config_example_is_the_contrib_file_and_a_valid_config(tmp_path) -> None:
    r = mps_health("config", "example")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (REPO / "contrib" / "config.example.yaml").read_text()
    path = tmp_path / "config.yaml"
    path.write_text(r.stdout)
    config = load(str(path), table=registry)  # the whole file, every section judged
    assert set(yaml.safe_load(r.stdout)) <= set(config.given)
    assert config.mps.layout == yaml.safe_load(r.stdout)["mps"]["layout"]
