"""The reset cooldown end to end, on private trees with the fake daemon: a second restart
of an instance within remediation.cooldown_s is refused (exit 1) naming the last reset's
time; a manual --force goes, an automatic reset (--automatic) never does."""


import os
import signal
import subprocess
import time

from clirun import mps_health
from mps_health.hostio import planned
from mps_health.model.facts_deep import PlannedRestart
from remhelp import daemons_of, remediating


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
    assert "refused: cooldown: the last reset of this instance was at " in again.stdout
    assert "remediation.cooldown_s is 600" in again.stdout and "--force" in again.stdout
    assert "acting:" not in again.stdout and daemons_of(site.pipe) == []
    dry = reset(cfg, "--dry-run")  # the plan says it too
    assert dry.returncode == 1 and "refused: cooldown:" in dry.stdout
    # Automatic (the Ansible role): refused even with --force.
    auto = reset(cfg, "--force", "--automatic")
    assert auto.returncode == 1, auto.stdout + auto.stderr
    assert "an automatic reset never restarts it again" in auto.stdout
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


def test_a_reset_outlives_the_job_hooks_churn_in_the_records() -> None:
    now = time.time()
    reset_rec = PlannedRestart("/tmp/x-pipe", now - 100, None, None, planned.RESET_BEGIN)
    churn = [PlannedRestart(f"/tmp/job{i}", now - 50 + i * 0.01, None, None, "prolog")
             for i in range(planned.MAX_RECORDS + 10)]
    kept = planned.keep((reset_rec, *churn), now)
    assert planned.last_reset(kept, "/tmp/x-pipe") == reset_rec.at
    assert len(kept) == planned.MAX_RECORDS + 1
