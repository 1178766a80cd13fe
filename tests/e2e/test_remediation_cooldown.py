"""The reset cooldown end to end, on private trees with the fake daemon: a second restart
on a node within remediation.cooldown_s, of the same instance or another one, is refused
(exit 1) naming the last reset's time and instance; a manual --force goes, an automatic
reset (--automatic) never does. The instances one call resets (--all) are one reset."""


import os
import signal
import subprocess
import time

from clirun import mps_health
from mps_health.hostio import planned
from mps_health.model.facts_deep import PlannedRestart
from remhelp import daemons_of, make_dirs, remediating


def reset(cfg: str, *extra: str) -> subprocess.CompletedProcess:
    return mps_health("remediate", "reset", "--config", cfg, *extra)


def broken(site) -> int:
    """Kill the instance's daemon (stale entries left): only a restart repairs it."""
    [pid] = daemons_of(site.pipe)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemons_of(site.pipe):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return pid


def test_second_restart_within_the_cooldown_is_refused_and_force_overrides(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site), remediation={"cooldown_s": 600})
    first = reset(cfg)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "acting:" in first.stdout
    broken(site)
    again = reset(cfg)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "refused: cooldown: the last reset on this node was at " in again.stdout
    assert ", of instance node (" in again.stdout
    assert "remediation.cooldown_s is 600" in again.stdout and "--force" in again.stdout
    assert "acting:" not in again.stdout and daemons_of(site.pipe) == []
    dry = reset(cfg, "--dry-run")  # the plan says it too
    assert dry.returncode == 1 and "refused: cooldown:" in dry.stdout
    # Automatic (the Ansible role): refused even with --force.
    auto = reset(cfg, "--force", "--automatic")
    assert auto.returncode == 1, auto.stdout + auto.stderr
    assert "an automatic reset never resets the node again" in auto.stdout
    assert daemons_of(site.pipe) == []
    forced = reset(cfg, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "note: cooldown: the last reset" in forced.stdout
    assert "restarting anyway (--force)" in forced.stdout
    assert "result: node is healthy again" in forced.stdout
    assert len(daemons_of(site.pipe)) == 1
    audit = (site.root / "audit.log").read_text().splitlines()
    refused = [ln for ln in audit if "event=refused" in ln]
    assert len(refused) == 2 and all("result=cooldown" in ln for ln in refused)
    assert "automatic=false" in refused[0] and "automatic=true" in refused[1]
    assert sum("event=begin" in ln for ln in audit) == 2


def test_the_cooldown_ends_and_zero_turns_it_off(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site), remediation={"cooldown_s": 600})
    assert reset(cfg).returncode == 0
    broken(site)
    # A reset an hour ago (the record back-dated): past the cooldown, the restart goes.
    records, error = planned.load(str(site.state_dir))
    assert not error and records
    old = tuple(r._replace(at=r.at - 3600.0) for r in records)
    from mps_health.hostio.state import StateFile

    assert StateFile(str(site.state_dir), planned.NAME).save(old) == ""
    r = reset(cfg, "--automatic")
    assert r.returncode == 0, r.stdout + r.stderr
    broken(site)
    off = site.config(remediating(site), remediation={"cooldown_s": 0})
    r = reset(off, "--automatic")
    assert r.returncode == 0, r.stdout + r.stderr


def per_gpu(site, cooldown_s: float) -> str:
    """Two instances, gpu0 and gpu1, with no daemon: each needs a restart."""
    for g in ("0", "1"):
        make_dirs(site.root / f"pipe{g}", site.root / f"log{g}")
    return site.config(remediating(site), mps={"layout": "per-gpu", "gpus": [0, 1]},
                       pipe=f"{site.root}/pipe{{gpu}}", log=f"{site.root}/log{{gpu}}",
                       remediation={"cooldown_s": cooldown_s})


def test_the_cooldown_is_per_node_a_reset_of_gpu0_holds_back_gpu1(site) -> None:
    cfg = per_gpu(site, 600)
    first = reset(cfg, "gpu0", "--automatic")
    assert first.returncode == 0, first.stdout + first.stderr
    assert len(daemons_of(site.root / "pipe0")) == 1
    # Another instance of the same node, within the cooldown: an automatic reset never
    # goes, --force included, and says which instance's reset holds it back.
    for extra in ((), ("--force",)):
        auto = reset(cfg, "gpu1", "--automatic", *extra)
        assert auto.returncode == 1, auto.stdout + auto.stderr
        assert "refused: cooldown: the last reset on this node was at " in auto.stdout
        assert ", of instance gpu0 (" in auto.stdout
        assert "an automatic reset never resets the node again" in auto.stdout
        assert "acting:" not in auto.stdout and daemons_of(site.root / "pipe1") == []
    # By hand: refused, saying --force; with --force it goes.
    manual = reset(cfg, "gpu1")
    assert manual.returncode == 1, manual.stdout + manual.stderr
    assert ", of instance gpu0 (" in manual.stdout and "or use --force" in manual.stdout
    assert daemons_of(site.root / "pipe1") == []
    forced = reset(cfg, "gpu1", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "restarting anyway (--force)" in forced.stdout
    assert len(daemons_of(site.root / "pipe1")) == 1
    audit = (site.root / "audit.log").read_text().splitlines()
    refused = [ln for ln in audit if "event=refused" in ln]
    assert len(refused) == 3 and all("result=cooldown" in ln and "instance=gpu1" in ln
                                     for ln in refused)
    assert sum("event=begin" in ln for ln in audit) == 2


def test_one_call_resetting_every_instance_is_one_reset_of_the_node(site) -> None:
    cfg = per_gpu(site, 600)
    r = reset(cfg, "--all", "--automatic")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused" not in r.stdout
    assert len(daemons_of(site.root / "pipe0")) == len(daemons_of(site.root / "pipe1")) == 1
    # The next call is a second reset of the node: refused for both instances.
    for g in ("0", "1"):
        [pid] = daemons_of(site.root / f"pipe{g}")
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemons_of(site.root / "pipe0") or daemons_of(site.root / "pipe1"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    again = reset(cfg, "--all", "--automatic")
    assert again.returncode == 1, again.stdout + again.stderr
    assert again.stdout.count("refused: cooldown:") == 2


def test_a_reset_outlives_the_job_hooks_churn_in_the_records() -> None:
    now = time.time()
    reset_rec = PlannedRestart("/tmp/x-pipe", now - 100, None, None, planned.RESET_BEGIN)
    churn = [PlannedRestart(f"/tmp/job{i}", now - 50 + i * 0.01, None, None, "prolog")
             for i in range(planned.MAX_RECORDS + 10)]
    kept = planned.keep((reset_rec, *churn), now)
    assert planned.last_reset(kept) == (reset_rec.at, "/tmp/x-pipe")
    assert len(kept) == planned.MAX_RECORDS + 1


def test_the_node_s_last_reset_is_the_newest_of_any_instance() -> None:
    now = time.time()
    records = (PlannedRestart("/tmp/p0", now - 300, None, None, planned.RESET_BEGIN),
               PlannedRestart("/tmp/p1", now - 200, None, None, planned.RESET_BEGIN),
               PlannedRestart("/tmp/p0", now - 100, None, None, "prolog"))
    assert planned.last_reset(records) == (now - 200, "/tmp/p1")
    assert planned.last_reset(records[2:]) == (float("-inf"), "")
