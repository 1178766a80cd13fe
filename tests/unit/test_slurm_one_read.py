"""A run reads the node with one ``scontrol -d show node NODE -o``, on every Slurm version.

A stand-in scontrol (a script that logs each call) answers with the text Slurm 24.11
printed; an older config that still names ``slurm.output`` loads and reads the same.
"""

import time
from pathlib import Path
from typing import List

import pytest
from conftest import FIXTURES
from mps_health.config.load import from_mapping
from mps_health.probes import slurm as probe
from mps_health.probes.context import Context

NODE_LINE = (FIXTURES / "scontrol_show_node_-d_-o__slurm-24.11_idle.txt").read_text()


def fake_scontrol(path: Path) -> Path:
    (path.parent / "idle.txt").write_text(NODE_LINE)
    path.write_text(f'#!/bin/sh\necho "$*" >> {path.parent}/calls.log\n'
                    f"cat {path.parent}/idle.txt\n")
    path.chmod(0o755)
    return path


def calls(path: Path) -> List[str]:
    log = path.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("slurm", [{}, {"output": "json"}, {"output": "auto"}])
def test_one_call_per_run_whatever_the_version(tmp_path: Path, slurm: dict) -> None:
    (tmp_path / "bin").mkdir()
    sc = fake_scontrol(tmp_path / "bin" / "scontrol")
    cfg = from_mapping({"node_name": "mpsnode", "run_dir": str(tmp_path / "run"),
                        "state_dir": str(tmp_path / "state"),
                        "commands": {"scontrol": str(sc)}, "slurm": slurm}, "t.yaml")
    for _ in range(2):
        facts = probe.read_slurm(Context(cfg, "/", time.monotonic() + 10, {}),
                                 want_jobs=False)
        assert facts.error is None and facts.node is not None
        assert facts.node.state == "IDLE"
    assert calls(sc) == ["-d show node mpsnode -o"] * 2
    assert not (tmp_path / "run").exists()  # nothing is kept between runs
