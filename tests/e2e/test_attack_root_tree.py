"""``check --root TREE`` writes nothing anywhere, whatever the tree holds: the tree may be
a user's (a container image, a copy handed to on-call) with links planted in it."""

import json
import os
import subprocess
import time
from pathlib import Path

from clirun import mps_health
from hostile import ATTACKER, ensure_user, public_dir, run_as
from roottree import add_dir, add_pipe_dir, add_process

__all__ = ["public_dir"]  # the fixture, used by name


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + ".000"


def _all_files(top: Path) -> list:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


def test_a_root_tree_run_writes_nothing_even_through_planted_links(public_dir: Path) -> None:
    tree, target, state = public_dir / "tree", public_dir / "elsewhere", public_dir / "state"
    for d in (tree, target, state):
        d.mkdir()
    add_process(tree, 4242, pipe_dir="/tmp/nvidia-mps")
    add_pipe_dir(tree, "/tmp/nvidia-mps", 4242)
    # The log dir is named in the config, under public_dir: the host's run below reads the
    # same path on the host (an empty dir), never the host's real /var/log/nvidia-mps.
    host_logs = public_dir / "logs"
    host_logs.mkdir()
    logs = add_dir(tree, str(host_logs))
    (logs / "control.log").write_text(
        f"[{_stamp(time.time() - 5)} Control   436] Client {{PID: 77, Context: 1}} encountered "
        "a fatal GPU error.\n")
    pw = ensure_user(ATTACKER)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(tree), str(target)],
                   check=True, timeout=30)
    target.chmod(0o777)
    r = run_as(ATTACKER, ["ln", "-s", str(target), str(tree / "run")])  # TREE/run -> elsewhere
    assert r.returncode == 0, r.stderr
    config = public_dir / "config.yaml"
    # run_dir: the default /run/mps-health, which --root reads under the tree
    config.write_text(f"state_dir: {state}\nmps:\n  log_dir: {host_logs}\n")
    before = (_all_files(tree), _all_files(target), _all_files(state))

    r = mps_health("check", "--root", str(tree), "--config", str(config), "--format", "json")
    report = json.loads(r.stdout)
    codes = {p["code"] for p in report["problems"]}
    assert "log-fatal" in codes or any(c.startswith("log-") for c in codes), report["problems"]
    assert (_all_files(tree), _all_files(target), _all_files(state)) == before

    # The host's own run (same state dir) afterwards knows nothing of the tree's log lines.
    host = public_dir / "host.yaml"
    host.write_text(f"state_dir: {state}\nrun_dir: {public_dir}/run\nmps:\n"
                    f"  pipe_dir: {public_dir}/pipe\n  log_dir: {public_dir}/log\n")
    r = mps_health("check", "--config", str(host), "--only", "logs", "--format", "json")
    assert not [p for p in json.loads(r.stdout)["problems"] if p["code"].startswith("log-")
                and "77" in p["message"]]


def test_a_relative_or_missing_root_is_one_line_and_unknown(public_dir: Path) -> None:
    config = public_dir / "config.yaml"
    config.write_text(f"state_dir: {public_dir}/state\nrun_dir: {public_dir}/run\n")
    r = mps_health("check", "--root", "some/tree", "--config", str(config))
    assert r.returncode == 3 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "must be an absolute path" in r.stderr
    missing = public_dir / "no-such-tree"
    r = mps_health("check", "--root", str(missing), "--config", str(config))
    assert r.returncode == 3 and "is not a directory" in r.stderr
    assert not missing.exists() and not (public_dir / "run").exists()
    assert os.listdir(public_dir) == ["config.yaml"]
