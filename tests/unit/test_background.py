"""background.Background: a thread joined against a deadline."""

import _thread

from mps_health.hostio.background import Background


def test_background_joins_against_a_deadline() -> None:
    """What the engine needs of a thread (start, join by a deadline), on _thread."""
    gate = _thread.allocate_lock()
    gate.acquire()
    done: list = []
    t = Background(lambda: (gate.acquire(), done.append(1)))
    assert t.join(0.05) is False and done == []  # still blocked: the deadline wins
    assert t.join(-5) is False  # a deadline already past: no wait at all
    gate.release()
    assert t.join(5.0) is True and done == [1]
    assert t.join(0) is True  # joined again: still done
