"""The commands a problem line quotes, pasted as printed, act on what the run judged.

A run given --config FILE (or --root DIR) adds them to every quoted 'mps-health ...'
command (mps_health.engine.actionhints); each command here is taken from the output,
split as a shell would (shlex.split, never a shell) and run.
"""

import json
import shlex
import shutil

from clirun import check_mps, mps_health
from pasted import commands
from remhelp import remediating


def pasted(words: list, *extra: str):
    assert words[0] == "mps-health", words
    return mps_health(*words[1:], *extra)


def node_problems(cfg: str, *extra: str) -> list:
    """Our instance's problems (other engineers' daemons on this machine are node-wide
    daemon-unexpected findings, not ours)."""
    r = mps_health("check", "--config", cfg, "--only", "daemon,control,directories",
                   "--format", "json", *extra)
    assert r.returncode in (0, 1, 2), r.stderr
    return [p for p in json.loads(r.stdout)["problems"] if p["instance"] == "node"]


def resets_in(actions: list) -> list:
    found = [shlex.split(c) for a in actions for c in commands(a)]
    return [c for c in found if c[1:3] == ["remediate", "reset"]]


def test_a_pasted_reset_acts_on_the_instance_the_check_judged(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    r = mps_health("check", "--config", cfg, "--only", "daemon,control,directories")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines()[1:] if "[node] " in line]
    assert any(" daemon-absent: " in line for line in lines), r.stdout
    for line in lines:  # every problem line: what to run, then where to read more
        code = line.split("] ", 1)[1].split(":", 1)[0]
        assert line.endswith(f"(runbook: mps-health explain {code})"), line
    resets = resets_in([line.split(" -> ", 1)[1] for line in lines])
    assert resets and all(c == ["mps-health", "remediate", "reset", "node", "--config", cfg]
                          for c in resets), resets
    plan = pasted(resets[0], "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert str(site.pipe) in plan.stdout, plan.stdout
    done = pasted(resets[0])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "node is healthy again" in done.stdout
    assert node_problems(cfg) == []  # the instance the check judged now has its daemon


def test_a_config_file_name_a_shell_would_split_is_quoted(site) -> None:
    site.dirs()
    odd = site.root / "it's my site $HOME.yaml"
    shutil.copy(site.config(remediating(site)), odd)
    problems = node_problems(str(odd))
    assert problems
    for p in problems:
        assert p["action"].endswith(f"(runbook: mps-health explain {p['code']})"), p
    resets = resets_in([p["action"] for p in problems])
    assert resets and resets[0] == ["mps-health", "remediate", "reset", "node", "--config",
                                    str(odd)]
    plan = pasted(resets[0], "--dry-run")
    assert plan.returncode == 0 and str(site.pipe) in plan.stdout, plan.stdout + plan.stderr


def test_a_root_tree_is_carried_where_the_command_takes_it(site, tmp_path) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    problems = node_problems(cfg, "--root", str(tmp_path))
    resets = resets_in([p["action"] for p in problems])
    assert resets and all(c[-4:] == ["--config", cfg, "--root", str(tmp_path)] for c in resets)


def test_check_mps_lines_carry_the_config(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    r = check_mps("--config", cfg, "-v", "--only", "daemon")
    assert r.returncode == 2, r.stdout
    absent = [line for line in r.stdout.splitlines()
              if line.startswith("CRITICAL daemon-absent node: ")]
    assert absent and absent[0].endswith(
        f"-> run 'mps-health remediate reset node --config {cfg}' (dry run first: --dry-run)"
        " (runbook: mps-health explain daemon-absent)"), r.stdout


def test_a_replay_carries_only_a_config_given_to_it(site, tmp_path) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    snap = tmp_path / "node.json"
    r = mps_health("snapshot", "--config", cfg, "-o", str(snap))
    assert r.returncode == 0, r.stderr

    def resets(*extra: str) -> list:
        out = mps_health("check", "--replay", str(snap), "--only", "daemon", "--format",
                         "json", *extra)
        return resets_in([p["action"] for p in json.loads(out.stdout)["problems"]
                          if p["instance"] == "node"])

    # its node's own config: the commands are for that node, as it runs by default
    assert resets() == [["mps-health", "remediate", "reset", "node"]]
    assert resets("--config", cfg) == [["mps-health", "remediate", "reset", "node",
                                        "--config", cfg]]


def test_the_health_checks_lines_carry_the_config(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    r = mps_health("healthcheck", "--foreground", "--dry-run", "--config", cfg)
    assert r.returncode == 2, r.stdout + r.stderr
    absent = [line for line in r.stdout.splitlines() if " daemon-absent: " in line]
    assert absent and resets_in([absent[0]]) == [
        ["mps-health", "remediate", "reset", "node", "--config", cfg]], r.stdout
    assert absent[0].endswith("(runbook: mps-health explain daemon-absent)")
