"""Restarts mps-health makes itself are planned: no daemon-restarted warning for them,
while an unplanned restart still warns, once per instance and code however often."""

from pathlib import Path

from clirun import mps_health
from mps_health.core import planned
from mps_health.core.facts_deep import InstanceServers, PlannedRestart, ServerEvent, ServerMemory
from mps_health.core.servertrack import MAX_EVENTS, advance
from mpsdaemon import start_daemon
from remhelp import daemons_of, kill_and_wait, make_dirs, remediating  # noqa: F401


def servers(pid: int, start: int = 5) -> InstanceServers:
    return InstanceServers("idle", "", pid, start, (), 0.0)


def test_a_recorded_restart_is_no_event_and_another_daemon_is() -> None:
    m1 = advance(None, servers(100), (), 1000.0, 3600)
    mine = (PlannedRestart("/p", 1050.0, 101, 5, "reset"),)
    assert advance(m1, servers(101), (), 1100.0, 3600, mine, "/p").events == ()
    # another daemon than the one we started, another pipe dir, or a record from before
    # the previous run: not excused
    assert advance(m1, servers(102), (), 1100.0, 3600, mine, "/p").events != ()
    assert advance(m1, servers(101), (), 1100.0, 3600, mine, "/q").events != ()
    old = (PlannedRestart("/p", 900.0, None, None, "unit stop"),)
    assert advance(m1, servers(101), (), 1100.0, 3600, old, "/p").events != ()
    # a unit start names no daemon: any change in that interval is ours
    unit = (PlannedRestart("/p", 1010.0, None, None, "unit start"),)
    assert advance(m1, servers(103), (), 1100.0, 3600, unit, "/p").events == ()


def test_records_are_bounded_and_dated(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    for i in range(planned.MAX_RECORDS + 10):
        assert planned.record(state, f"/p{i}", "reset", i, i) == ""
    records, error = planned.load(state)
    assert error == "" and len(records) == planned.MAX_RECORDS
    assert records[-1].pipe_dir == f"/p{planned.MAX_RECORDS + 9}"
    assert planned.keep([PlannedRestart("/x", float("nan")),
                         PlannedRestart("/x", 1e308)], 1000.0) == ()


def test_a_read_only_state_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    why = planned.record(str(tmp_path / "file" / "state"), "/p", "reset")
    assert why.startswith("cannot record the planned restart in ")


def test_events_are_bounded_per_instance() -> None:
    m = ServerMemory(0.0, 1, 1, (), tuple(ServerEvent(float(i), "daemon-restarted", "x")
                                          for i in range(500)))
    assert len(advance(m, servers(2, 2), (), 600.0, 3600).events) == MAX_EVENTS


def test_reset_then_check_is_ok_but_an_unplanned_restart_warns_once(site) -> None:
    site.dirs()
    cfg = site.config(remediating(site))
    start_daemon(site.pipe, site.log)

    def check() -> str:
        r = mps_health("check", "--config", cfg, "--only", "servers")
        assert r.returncode in (0, 1), r.stdout + r.stderr
        return r.stdout

    check()  # remembers the daemon
    r = mps_health("remediate", "reset", "--config", cfg, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "daemon-restarted" not in check()  # our own restart: no alarm
    for _ in range(3):  # three unplanned restarts: one finding with a count
        for pid in daemons_of(site.pipe):
            kill_and_wait(pid)
        start_daemon(site.pipe, site.log)
        out = check()
    lines = [ln for ln in out.splitlines() if "daemon-restarted" in ln]
    assert len(lines) == 2, out  # the summary and one finding
    assert "daemon-restarted: 3 times, first " in out and "the last: the control daemon " \
        "changed since the last run" in out, out
