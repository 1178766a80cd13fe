"""A live daemon is never daemon-stale: /proc is scanned before the pid file is read, so a
daemon started in between is named by its pid file but missing from the scan; the named
pid is read again (probes.proc.with_named) before the daemon check calls it stale."""

import threading
import time
from typing import Dict, List, Tuple

from clirun import mps_health, results
from mps_health.config.load import load
from mps_health.engine import run as engine
from mps_health.probes import dirs as dirs_probe
from mps_health.probes import proc
from remhelp import kill_and_wait

# Restarts of the stress test: bounded, and enough for checks to land in the gaps.
RESTARTS = 25


def test_a_daemon_started_after_the_scan_is_not_stale(site, monkeypatch) -> None:
    d = site.start_daemon()
    config = load(site.config(), table=None)
    # The scan ran just before the daemon started: it saw no MPS process at all.
    monkeypatch.setattr(proc, "gather_for", lambda ctx, instances: ())
    _facts, report = engine.run(config, only=["daemon"])
    (res,) = [r for run in report.runs for r in run.results]
    assert (res.code, res.message) == ("ok", f"control daemon {d.pid} serves {site.pipe}"), res
    # A pid file naming a process that is not there is still stale.
    assert d.pid is not None
    kill_and_wait(d.pid)
    _facts, report = engine.run(config, only=["daemon"])
    (res,) = [r for run in report.runs for r in run.results]
    assert res.code == "daemon-stale" and "which is not a live daemon" in res.message, res


def test_restarts_while_checks_run_never_call_a_live_daemon_stale(site, monkeypatch) -> None:
    """The fake daemon killed and started again in a loop while checks run beside it; every
    other restart lands, in a run of our own, exactly between the scan and the pid file's
    read (what a loaded machine did by chance). No check calls a daemon stale that lived
    through its whole run."""
    d = site.start_daemon()
    cfg = site.config()
    config = load(cfg, table=None)
    # pid -> (monotonic time it was known alive from, time it was killed; inf while alive)
    lives: Dict[int, Tuple[float, float]] = {}
    assert d.pid is not None
    lives[d.pid] = (time.monotonic(), float("inf"))
    seen: List[Tuple[float, float, str, str]] = []  # (start, end, code, message)
    done = threading.Event()
    failures: List[str] = []

    def checks() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            r = mps_health("check", "--config", cfg, "--only", "daemon", "--format", "json")
            t1 = time.monotonic()
            if r.returncode not in (0, 2):
                failures.append(r.stdout + r.stderr)
                continue
            for res in results(r, "daemon"):
                seen.append((t0, t1, res["code"], res["message"]))

    def start() -> None:
        d.start()
        assert d.pid is not None
        lives[d.pid] = (time.monotonic(), float("inf"))

    read_dirs = dirs_probe.gather

    def restart_then_read(ctx, instances):  # the scan is done: restart, then read
        start()
        return read_dirs(ctx, instances)

    worker = threading.Thread(target=checks)
    worker.start()
    try:
        for i in range(RESTARTS):
            assert d.pid is not None
            old = d.pid
            # Dated before the kill and after the start: the lives noted are never longer
            # than the real ones.
            lives[old] = (lives[old][0], time.monotonic())
            kill_and_wait(old)
            if i % 2:
                start()
                continue
            with monkeypatch.context() as m:
                m.setattr(dirs_probe, "gather", restart_then_read)
                _facts, report = engine.run(config, only=["daemon"])
            (res,) = [r for run in report.runs for r in run.results]
            assert (res.code, res.message) == ("ok", f"control daemon {d.pid} serves "
                                                      f"{site.pipe}"), res
    finally:
        done.set()
        worker.join(120)
    assert not failures, failures[0]
    assert seen, "no check ran"
    for t0, t1, code, message in seen:
        if code != "daemon-stale":
            continue
        named = int(message.split("pid file names ", 1)[1].split(",", 1)[0])
        born, killed = lives.get(named, (float("inf"), float("-inf")))
        # Alive for the check's whole run, yet called stale: the race.
        assert not (born <= t0 and t1 <= killed), (named, message)
