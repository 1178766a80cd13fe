"""The exporter's rate-limited log lines, on a fake clock: one line per kind and interval."""

from typing import List

from mps_health.exporters.logthrottle import Throttled


def test_first_event_at_once_then_one_counted_line_per_interval() -> None:
    now = [100.0]
    lines: List[str] = []
    log = Throttled(60.0, write=lines.append, clock=lambda: now[0], prefix="")
    log.note("cap", "over the cap")
    assert lines == ["over the cap (1 so far; more are counted, one line per 60s)"]
    for _ in range(100000):  # a flood within the interval: counted, not written
        log.note("cap", "over the cap")
    log.flush()
    assert len(lines) == 1
    now[0] += 30
    log.note("slow", "slowloris")  # another kind has its own interval
    assert len(lines) == 2
    now[0] += 30
    log.flush()
    assert lines[2:] == ["over the cap (100000 in the last 60s)"]
    now[0] += 5
    log.note("slow", "slowloris")
    log.flush(final=True)  # at shutdown nothing counted is lost
    assert lines[3:] == ["slowloris (1 in the last 35s)"]
    log.flush(final=True)
    assert len(lines) == 4


def test_a_closed_stderr_costs_nothing(monkeypatch) -> None:
    import io

    from mps_health.exporters import logthrottle

    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr("sys.stderr", closed)
    logthrottle.to_stderr("x")  # ValueError (closed file) swallowed: the server goes on
