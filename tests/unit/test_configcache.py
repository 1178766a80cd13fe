"""The default config file's parsed form is kept for the next run, and used only while
it is root's, unchanged, and describes the file as it is now (config/cache.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mps_health.config import cache as configcache
from mps_health.config import load as config_mod

CONFIG = "budget_s: 7\ncontrol:\n  timeout_s: 1.5\nmps:\n  pipe_dir: /tmp/mpsh-cc/pipe\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's (run as root)")


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    etc = tmp_path / "etc"
    run = tmp_path / "run"
    etc.mkdir()
    tmp_path.chmod(0o755)
    default = etc / "config.yaml"
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", str(default))
    monkeypatch.setattr(configcache, "CACHE", str(run / "config.json"))
    return default, run / "config.json"


def load_without_yaml(default: Path, cache: Path) -> str:
    """load() in a fresh interpreter where importing yaml fails: the budget it read."""
    code = ("import sys\nsys.modules['yaml'] = None\n"
            "from mps_health.config import load as config; from mps_health.config import cache as configcache\n"
            f"config.DEFAULT_PATH = {str(default)!r}\n"
            f"configcache.CACHE = {str(cache)!r}\n"
            "print(config.load().budget_s)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return (r.stdout.strip() or r.stderr.strip().splitlines()[-1]) if r.returncode == 0 \
        else "failed: " + r.stderr.strip().splitlines()[-1]


def test_the_second_load_reads_no_yaml_and_gives_the_same_config(paths) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    first = config_mod.load()
    assert cache.exists() and oct(cache.stat().st_mode & 0o777) == "0o644"
    assert json.loads(cache.read_text())["data"] == {
        "budget_s": 7, "control": {"timeout_s": 1.5}, "mps": {"pipe_dir": "/tmp/mpsh-cc/pipe"}}
    assert config_mod.load() == first
    assert load_without_yaml(default, cache) == "7.0"


def test_an_explicit_default_path_uses_it_and_another_file_never(paths, tmp_path) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    config_mod.load(str(default))
    assert cache.exists()
    cache.unlink()
    other = tmp_path / "other.yaml"
    other.write_text(CONFIG)
    config_mod.load(str(other))
    assert not cache.exists()


def test_a_changed_file_is_parsed_again_even_at_the_same_size(paths) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    config_mod.load()
    default.write_text(CONFIG.replace("budget_s: 7", "budget_s: 8"))  # same size
    assert load_without_yaml(default, cache).startswith("failed: ")  # the cache is stale
    assert config_mod.load().budget_s == 8.0
    assert load_without_yaml(default, cache) == "8.0"  # kept again


def forged(default: Path, cache: Path, budget: int) -> None:
    """A cache whose key fits the file but whose data says something else."""
    kept = json.loads(cache.read_text())
    kept["data"]["budget_s"] = budget
    cache.write_text(json.dumps(kept))


@pytest.mark.parametrize("spoil", ["group-writable", "other-owner", "symlink", "open-dir"])
def test_a_cache_others_could_have_written_is_not_used(paths, tmp_path, spoil) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    config_mod.load()
    forged(default, cache, 99)
    assert config_mod.load().budget_s == 99.0  # root's own cache is believed ...
    if spoil == "group-writable":
        cache.chmod(0o664)
    elif spoil == "other-owner":
        os.chown(cache, 65534, 65534)
    elif spoil == "symlink":
        real = tmp_path / "elsewhere.json"
        cache.rename(real)
        cache.symlink_to(real)
    else:
        cache.parent.chmod(0o777)
    assert config_mod.load().budget_s == 7.0  # ... one anybody could have made is not


def test_values_json_cannot_hold_are_not_kept(paths) -> None:
    default, cache = paths
    default.write_text(CONFIG + "checks:\n  enable: []\n1: x\n")  # an int key
    with pytest.raises(config_mod.ConfigError):
        config_mod.load()
    assert not cache.exists()  # a bad config is never kept
    assert not configcache._plain({1: "x"}) and not configcache._plain({"a": [b"x"]})
    import datetime

    assert not configcache._plain({"when": datetime.date(2026, 1, 1)})
    assert configcache._plain({"a": [1, 2.5, None, True, "x", {"b": []}]})


def test_only_root_writes_it(paths, monkeypatch: pytest.MonkeyPatch) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert config_mod.load().budget_s == 7.0
    assert not cache.exists()


def test_a_damaged_cache_costs_only_the_parse(paths) -> None:
    default, cache = paths
    default.write_text(CONFIG)
    config_mod.load()
    for junk in (b"", b"{", b"[]", b'{"format": 1}', b"\xff\xfe", b"[" * 100000):
        cache.write_bytes(junk)
        cache.chmod(0o644)
        assert config_mod.load().budget_s == 7.0
