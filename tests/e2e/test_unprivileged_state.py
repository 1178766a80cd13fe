"""check_mps run as an unprivileged user (nagios) next to root's runs: it reads the
memory root keeps, says what it does not save (notes, not counted as checks passed, so
its "N checks passed" is root's), and changes nothing there."""
# ruff: noqa: F811  (the fixture public_dir comes from hostile)

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from hostile import VICTIM, public_dir, setpriv  # noqa: F401
from mps_health.hostio.state import StateFile
from mps_health.model.facts_deep import ServerMemory


def test_a_user_reads_roots_history_and_says_it_saves_nothing(public_dir: Path) -> None:
    base = public_dir
    state = base / "state"
    state.mkdir(mode=0o755)
    for d in ("pipe", "log"):
        (base / d).mkdir()
        (base / d).chmod(0o777)
    cfg = base / "c.yaml"
    cfg.write_text(f"state_dir: {state}\nrun_dir: {base}/run\nmps:\n  pipe_dir: {base}/pipe\n"
                   f"  log_dir: {base}/log\n")
    cfg.chmod(0o644)
    # root's memory of the instance
    memory = StateFile(str(state), "servers")
    assert memory.save({"node": ServerMemory(0.0, 1, 1, (), ())}) == ""
    before = (state / "servers.json").read_bytes()
    probe = subprocess.run([*setpriv(VICTIM), sys.executable, "-c", "import mps_health.cli.main"],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME="/"))
    if probe.returncode != 0:
        pytest.skip("the test user cannot import this checkout's mps_health with this "
                    "interpreter: " + probe.stderr.strip().splitlines()[-1][:200])
    r = subprocess.run([*setpriv(VICTIM), sys.executable, "-m", "mps_health.cli.main", "check",
                        "--config", str(cfg), "--only", "servers,logs", "-v"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HOME="/"))
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    # What to do (run as root), not the errno behind it.
    assert "Traceback" not in r.stderr and "Permission denied" not in r.stdout, r.stdout
    uid = int(subprocess.run([*setpriv(VICTIM), "id", "-u"], capture_output=True, text=True,
                             timeout=10).stdout)
    saved = f"read from {state}, not saved: uid {uid} may not write there (run as root to save it)"
    assert f"NOTE servers: server history: {saved}" in r.stdout, r.stdout
    assert f"NOTE logs: log offsets: {saved}" in r.stdout, r.stdout
    assert (state / "servers.json").read_bytes() == before
    assert sorted(p.name for p in state.iterdir()) == ["servers.json"]  # no lock, no file
    # The notes are no checks passed: root's run has the same OK lines ("N checks passed"
    # counts them), and no note.
    as_root = subprocess.run([sys.executable, "-m", "mps_health.cli.main", "check", "--config",
                              str(cfg), "--only", "servers,logs", "-v"], capture_output=True,
                             text=True, timeout=60)

    def passed(out: str) -> List[str]:
        return [line for line in out.splitlines() if line.startswith("OK ")]

    assert passed(as_root.stdout) == passed(r.stdout) != [], (as_root.stdout, r.stdout)
    assert "NOTE " not in as_root.stdout
