"""A source split in two (its probe's ``start``): started before the others are read,
collected after them, with no thread of the engine's."""

import time
from pathlib import Path
from typing import List

import pytest
from mps_health.config.load import from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.probes.context import Context

ORDER: List[str] = []


def start(ctx, insts):
    ORDER.append("start")
    return lambda: ORDER.append("collected") or "answer"


def broken_start(ctx, insts):
    raise OSError("cannot start it")


def inline(ctx, insts):
    ORDER.append("inline")
    return "read"


def whole(ctx, insts):
    return "whole"


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> List[object]:
    """The threads the engine would have started (none are)."""
    monkeypatch.setattr(registry, "SOURCES", {
        "split": registry.Source("split", lambda: registry.Probe(whole, str, start)),
        "inline": registry.Source("inline", lambda: registry.Probe(inline, str)),
        "broken": registry.Source("broken", lambda: registry.Probe(whole, str, broken_start)),
    })
    started: List[object] = []
    monkeypatch.setattr(engine.threading, "Thread", lambda *a, **kw: started.append(kw))
    ORDER.clear()
    return started


def test_started_first_collected_after_the_others_without_a_thread(
        threads: List[object], tmp_path: Path) -> None:
    ctx = Context(from_mapping({}, "test"), str(tmp_path), time.monotonic() + 5)
    facts = engine.gather(ctx, ["inline", "split", "broken"],
                          meanwhile=lambda: ORDER.append("meanwhile"))
    assert ORDER == ["start", "inline", "meanwhile", "collected"]
    assert facts.sources["split"] == "answer" and facts.sources["inline"] == "read"
    assert facts.errors == {"broken": "OSError: cannot start it"}
    assert set(facts.durations) == {"split", "inline", "broken"}
    assert threads == []
