"""Snapshots: facts saved as JSON judge the same way later; bad files get one line."""

import json
from pathlib import Path

import pytest
from clirun import mps_health
from conftest import REPO

EXAMPLES = REPO / "examples"


def test_snapshot_then_replay_gives_the_same_verdict(tmp_path: Path, site) -> None:
    d = site.start_daemon()
    (d.pipe_dir).chmod(0o700)
    cfg = site.config()
    snap = tmp_path / "snap.json"
    r = mps_health("snapshot", "--config", cfg, "-o", str(snap))
    assert r.returncode == 0, r.stderr
    live = mps_health("check", "--config", cfg, "--format", "json", "--skip", "strays")
    d.stop()  # the node changes; the snapshot does not
    replayed = mps_health("check", "--replay", str(snap), "--format", "json", "--skip", "strays")
    assert replayed.returncode == live.returncode == 2
    codes = lambda out: sorted(p["code"] for p in json.loads(out)["problems"])  # noqa: E731
    assert codes(replayed.stdout) == codes(live.stdout) == ["pipe-dir-mode"]


@pytest.mark.parametrize("content,message", [
    ("not json", "not JSON"),
    ('{"format": "other"}', "not an mps-health snapshot"),
    ('{"format": "mps-health-snapshot", "format_version": 99}', "format 99 is not supported"),
    ('{"format": "mps-health-snapshot", "format_version": 1, "node": "n", "taken_at": 1,'
     ' "sources": {"processes": [{"pid": "x"}]}}', "sources.processes[0]"),
])
def test_bad_snapshot_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    snap = tmp_path / "bad.json"
    snap.write_text(content)
    r = mps_health("check", "--replay", str(snap))
    assert r.returncode == 3
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name,state", [("healthy-node.json", 0), ("broken-node.json", 2)])
def test_shipped_examples_replay(name: str, state: int) -> None:
    r = mps_health("check", "--replay", str(EXAMPLES / name))
    assert r.returncode == state, r.stdout + r.stderr
    assert r.stdout.startswith("MPS " + ("OK" if state == 0 else "CRITICAL"))


def test_a_replay_past_its_limit_says_so_and_blames_no_file_system() -> None:
    """Judging a replay touches no file and starts nothing: a replay that outlasts the
    hard limit is told to take more time, not sent looking for a hung file system."""
    from mps_health.config.load import Config
    from mps_health.engine import run as engine
    from mps_health.engine.snapshot import read

    facts, _ = read(str(EXAMPLES / "broken-node.json"))
    with pytest.raises(engine.Overrun) as caught:
        engine.run(Config(), replay=facts, limit_s=0.0)
    line = str(caught.value)
    assert line.startswith(f"judging the replayed snapshot ({len(facts.instances)} instances) "
                           "did not finish within 0s: ") and "--budget" in line
    assert "hung" not in line and "\n" not in line
