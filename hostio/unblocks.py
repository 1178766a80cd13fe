"""The blockers mps-health ended or continued, kept a day: who blocks MPS again and again.

``remediate unblock`` and the health check's unblock step record each process they act
on (``state_dir/unblocks.json``, the newest ``MAX_RECORDS`` of the last ``KEEP_S``
seconds); the blockers probe reads them so that a uid blocking MPS over and over is a
WARNING naming it. Best effort: a record that cannot be written is one line, never fatal.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional, Sequence, Tuple

from mps_health.hostio.state import StateFile

NAME = "unblocks"
KEEP_S = 86400.0
MAX_RECORDS = 256


class Unblocked(NamedTuple):
    """One process acted on: when, whose, on which instance, what it was."""

    at: float
    uid: int
    user: Optional[str]
    instance: str
    kind: str  # the blocker's kind (checks/blockers.py: connection, server, ...)


VALUE_TYPE = Tuple[Unblocked, ...]


def _fresh(records: Sequence[Unblocked], now: float) -> Tuple[Unblocked, ...]:
    kept = sorted((r for r in records if isinstance(r.at, float)
                   and now - KEEP_S <= r.at <= now + 60.0), key=lambda r: r.at)
    return tuple(kept[-MAX_RECORDS:])


def recent(state_dir: str, now: float) -> Tuple[Tuple[Unblocked, ...], str]:
    """(the records of the last day, why they could not be read or ""); nothing is read
    on a node where nothing was ever unblocked (no file)."""
    state = StateFile(state_dir, NAME)
    if not os.path.lexists(state.path):
        return (), ""
    records, note = state.load(VALUE_TYPE, ())
    return _fresh(records, now), note


def record(state_dir: str, done: Sequence[Unblocked], now: float) -> str:
    """Add ``done`` to the records; '' or one line saying why it could not be saved."""
    if not done:
        return ""
    state = StateFile(state_dir, NAME)

    def change() -> Tuple[Unblocked, ...]:
        old, _note = state.load(VALUE_TYPE, ())
        return _fresh((*old, *done), now)

    return state.update(2.0, change)
