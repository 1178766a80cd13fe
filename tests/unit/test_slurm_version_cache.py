"""``slurm.output: auto`` asks ``scontrol --version`` once per scontrol binary.

A stand-in scontrol (a script that logs each call) answers as Slurm 24.11 does; the
cache is keyed on the binary's real path, inode, size and mtime, kept in the run dir
(written atomically, never through a planted link) and in this process's memory.
"""

import os
import time
from pathlib import Path
from typing import List

import pytest
from conftest import FIXTURES
from mps_health.config.load import from_mapping
from mps_health.model.context import Context
from mps_health.probes import slurm as probe

NODE_LINE = (FIXTURES /
             "scontrol_show_node_-d_-o__slurm-24.11_idle.txt").read_text()
NODE_JSON = (FIXTURES /
             "scontrol_--json_show_node__slurm-24.11_idle.json").read_text()


def fake_scontrol(path: Path, version: str = "slurm-wlm 24.11.5") -> Path:
    (path.parent / "idle.txt").write_text(NODE_LINE)
    (path.parent / "idle.json").write_text(NODE_JSON)
    path.write_text(f"""#!/bin/sh
echo "$*" >> {path.parent}/calls.log
case "$1" in
  --version) echo "{version}" ;;
  --json) cat {path.parent}/idle.json ;;
  *) cat {path.parent}/idle.txt ;;
esac
""")
    path.chmod(0o755)
    return path


def calls(path: Path) -> List[str]:
    log = path.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def read(tmp_path: Path, scontrol: Path, run_dir: str = "run") -> probe.SlurmFacts:
    cfg = from_mapping({"node_name": "mpsnode", "run_dir": str(tmp_path / run_dir),
                        "state_dir": str(tmp_path / "state"),
                        "commands": {"scontrol": str(scontrol)}, "slurm": {}}, "t.yaml")
    return probe.read_slurm(Context(cfg, "/", time.monotonic() + 10, {}), want_jobs=False)


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "_KNOWN_VERSIONS", {})


def test_one_version_call_then_one_call_per_run(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    sc = fake_scontrol(tmp_path / "bin" / "scontrol")
    first = read(tmp_path, sc)
    assert calls(sc) == ["--version", "--json show node mpsnode"]
    assert first.output == "json" and first.node is not None and first.node.state == "IDLE"
    monkeypatch.setattr(probe, "_KNOWN_VERSIONS", {})  # a new process: the run dir knows
    read(tmp_path, sc)
    assert calls(sc)[2:] == ["--json show node mpsnode"]
    cache = (tmp_path / "run" / probe.VERSION_FILE)
    key, _, version = cache.read_text().strip().partition("\t")
    assert version == "24.11" and key == probe.binary_key(str(sc))
    assert cache.stat().st_mode & 0o777 == 0o644  # Nagios (not root) reads it too


def test_an_upgraded_binary_is_asked_again(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    sc = fake_scontrol(tmp_path / "bin" / "scontrol", "slurm-wlm 22.05.8")
    assert read(tmp_path, sc).output == "text"
    # The package manager replaces the file (new inode), as an upgrade does.
    new = fake_scontrol(tmp_path / "bin" / "scontrol.new", "slurm-wlm 24.11.5")
    os.replace(new, sc)
    monkeypatch.setattr(probe, "_KNOWN_VERSIONS", {})
    assert read(tmp_path, sc).output == "json"
    assert [c for c in calls(sc) if c == "--version"] == ["--version", "--version"]


def test_the_memory_serves_a_process_that_cannot_write_the_run_dir(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    sc = fake_scontrol(tmp_path / "bin" / "scontrol")
    (tmp_path / "run").write_text("not a dir")  # the run dir cannot be made
    for _ in range(3):
        assert read(tmp_path, sc).output == "json"
    assert calls(sc).count("--version") == 1


def test_a_planted_link_is_neither_followed_nor_trusted(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    sc = fake_scontrol(tmp_path / "bin" / "scontrol")
    (tmp_path / "run").mkdir()
    target = tmp_path / "elsewhere"
    target.write_text(f"{probe.binary_key(str(sc))}\t22.5\n")  # a lie: text only
    (tmp_path / "run" / probe.VERSION_FILE).symlink_to(target)
    assert read(tmp_path, sc).output == "json"  # asked scontrol itself
    assert target.read_text().endswith("\t22.5\n")  # not written through the link
    assert not (tmp_path / "run" / probe.VERSION_FILE).is_symlink()


def test_a_version_call_that_fails_means_text(tmp_path: Path) -> None:
    # Slurm 24.11's scontrol with no slurm.conf and no DNS SRV record prints this.
    (tmp_path / "bin").mkdir()
    sc = tmp_path / "bin" / "scontrol"
    sc.write_text("#!/bin/sh\necho \"$*\" >> " + str(tmp_path / "bin" / "calls.log") + "\n"
                  "case \"$1\" in --version) echo 'scontrol: fatal: Could not establish a "
                  "configuration source' >&2; exit 1;; esac\ncat "
                  + str(tmp_path / "bin" / "idle.txt") + "\n")
    sc.chmod(0o755)
    (tmp_path / "bin" / "idle.txt").write_text(NODE_LINE)
    facts = read(tmp_path, sc)
    assert facts.output == "text" and facts.node is not None and facts.error is None
