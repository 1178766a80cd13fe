"""context.joined: a thread waited for against a deadline, as the engine and the servers
probe wait for theirs."""

import threading

from mps_health.probes.context import joined


def test_a_thread_is_joined_against_a_deadline() -> None:
    gate = threading.Lock()
    gate.acquire()
    done: list = []
    t = threading.Thread(target=lambda: (gate.acquire(), done.append(1)), daemon=True)
    t.start()
    assert joined(t, 0.05) is False and done == []  # still blocked: the deadline wins
    assert joined(t, -5) is False  # a deadline already past: no wait at all
    gate.release()
    assert joined(t, float("inf")) is True and done == [1]  # no deadline: until it ends
    assert joined(t, 0) is True  # joined again: still done
