"""Restarts mps-health makes itself, recorded so that only unplanned ones warn.

``remediate reset`` (before it acts and once its daemon started), ``unit prepare``/``unit
stop`` and the Slurm hooks change an instance's control daemon on purpose and record it
in ``state_dir/planned.json`` (``state.StateFile``; the newest ``MAX_RECORDS`` of the last
``KEEP_S`` seconds), so the servers check does not call it ``daemon-restarted``. A record
names the pipe dir and, where known, the daemon started: then only that daemon is
excused, else any change between the runs around the record. An action that ends the
daemon (``ENDS_SERVERS``) ends its servers too (no ``server-churn``); a reset whose daemon
answers is the repair the events ask for (``repaired_at``). Recording is best effort: a
failure is one line for the caller, never fatal.

What no action of ours explains is acknowledged with ``mps-health ack CODE [INSTANCE]``:
that code's events up to the ack are no longer reported. ``state_dir/acks.json`` keeps
the newest ``MAX_ACKS`` of the last ``KEEP_S`` seconds.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

from mps_health.hostio.state import StateFile
from mps_health.model.facts_deep import Ack, PlannedRestart

NAME = "planned"
# The records of actions that end the instance's daemon and so all of its servers (the
# Slurm hooks' names are jobphase.TEARDOWN; tests/e2e/test_planned_restarts.py ties them).
ENDS_SERVERS = ("reset begin", "reset", "unit stop", "epilog", "prolog undo")
# A reset records itself before its first quit (a run while it acts sees ours in what
# goes), and again as REPAIR once the daemon it started answers.
RESET_BEGIN = "reset begin"
REPAIR = "reset"
RESETS = (RESET_BEGIN, REPAIR)
MAX_RECORDS = 256  # the Prolog and Epilog record three steps per job
KEEP_S = 7 * 86400.0
MAX_KEPT_RESETS = 64  # instances whose last reset is kept beyond MAX_RECORDS
T = TypeVar("T", bound=Union[PlannedRestart, Ack])


def _fresh(records: Sequence[T], now: float) -> List[T]:
    """Those with a valid time of the last KEEP_S seconds, oldest first (nan and the
    infinities fail the range comparison)."""
    return sorted((r for r in records
                   if isinstance(r.at, float) and now - KEEP_S <= r.at <= now + 60.0),
                  key=lambda r: r.at)


def keep(records: Sequence[PlannedRestart], now: float) -> Tuple[PlannedRestart, ...]:
    """The records worth keeping: valid times, not too old, the newest MAX_RECORDS."""
    fresh = _fresh(records, now)
    kept = fresh[-MAX_RECORDS:]
    # Each instance's newest reset outlives the Prolog's and Epilog's churn: the reset
    # cooldown (last_reset, the node's newest) reads them. Bounded, newest first.
    have = {r.pipe_dir for r in kept if r.by in RESETS}
    extra: List[PlannedRestart] = []
    for r in reversed(fresh[:-MAX_RECORDS]):
        if len(extra) < MAX_KEPT_RESETS and r.by in RESETS and r.pipe_dir not in have:
            have.add(r.pipe_dir)
            extra.append(r)
    return tuple(sorted((*extra, *kept), key=lambda r: r.at))


def record(state_dir: str, pipe_dir: str, by: str, daemon_pid: Optional[int] = None,
           daemon_start: Optional[int] = None, wait_s: float = 2.0) -> str:
    """Add a record, waiting up to ``wait_s`` for the lock; '' or one line saying why it
    could not be kept."""
    new = PlannedRestart(os.path.normpath(pipe_dir), time.time(), daemon_pid, daemon_start, by)
    problem = _add(StateFile(state_dir, NAME), Tuple[PlannedRestart, ...], new, keep, wait_s)
    return f"planned restart not recorded: {problem}" if problem else ""


def _add(state: StateFile, value_type: Any, new: T,
         keep_new: Callable[[Sequence[T], float], Tuple[T, ...]], wait_s: float) -> str:
    """Save ``new`` with the kept old ones under the file's lock; '' or why not."""

    def changed() -> Tuple[T, ...]:
        old, _ = state.load(value_type, ())
        return keep_new((*old, new), new.at)

    return state.update(wait_s, changed)


def _load(state_dir: str, name: str, value_type: Any,
          keep_now: Callable[[Sequence[T], float], Tuple[T, ...]]) -> Tuple[Tuple[T, ...], str]:
    """The kept records (read only, no lock: the file is replaced atomically), any error."""
    records, error = StateFile(state_dir, name).load(value_type, ())
    return keep_now(records, time.time()), error


def load(state_dir: str) -> Tuple[Tuple[PlannedRestart, ...], str]:
    return _load(state_dir, NAME, Tuple[PlannedRestart, ...], keep)


def excused(records: Sequence[PlannedRestart], pipe_dir: str, since: float, now: float,
            daemon_pid: Optional[int], daemon_start: Optional[int]) -> bool:
    """Was the daemon change seen between ``since`` and ``now`` made by us?"""
    pipe_dir = os.path.normpath(pipe_dir)
    return any(r.pipe_dir == pipe_dir and since <= r.at <= now
               and (r.daemon_pid is None
                    or (r.daemon_pid, r.daemon_start) == (daemon_pid, daemon_start))
               for r in records)


def servers_ended(records: Sequence[PlannedRestart], pipe_dir: str, since: float,
                  now: float) -> bool:
    """Did an action of ours end the instance's daemon, and so its servers, between the
    run at ``since`` and this one?"""
    pipe_dir = os.path.normpath(pipe_dir)
    return any(r.pipe_dir == pipe_dir and r.by in ENDS_SERVERS and since <= r.at <= now
               for r in records)


def repaired_at(records: Sequence[PlannedRestart], pipe_dir: str, now: float) -> float:
    """When the instance was last repaired by a reset (up to ``now``); -inf if never."""
    pipe_dir = os.path.normpath(pipe_dir)
    return max((r.at for r in records
                if r.pipe_dir == pipe_dir and r.by == REPAIR and r.at <= now),
               default=float("-inf"))


def last_reset(records: Sequence[PlannedRestart]) -> Tuple[float, str]:
    """When a reset (its begin record: a failed cure is not retried in a loop) last acted
    on any instance of this node, and that pipe dir; (-inf, '') if never. The cooldown is
    per node, so automatic resets of a node whose MPS keeps breaking do not walk through
    its instances one after another, each costing that GPU's jobs their servers."""
    return max(((r.at, r.pipe_dir) for r in records if r.by in RESETS),
               key=lambda t: t[0], default=(float("-inf"), ""))


# --- an operator's acks ---------------------------------------------------------------

ACKS = "acks"
MAX_ACKS = 64


def keep_acks(records: Sequence[Ack], now: float) -> Tuple[Ack, ...]:
    """The acks worth keeping: valid times, not too old (KEEP_S), the newest MAX_ACKS."""
    return tuple(_fresh(records, now)[-MAX_ACKS:])


def acknowledge(state_dir: str, code: str, instance: str = "", wait_s: float = 5.0) -> str:
    """Add an ack, waiting up to ``wait_s`` for the lock; '' or one line saying why not."""
    new = Ack(code, instance, time.time())
    problem = _add(StateFile(state_dir, ACKS), Tuple[Ack, ...], new, keep_acks, wait_s)
    return f"not acknowledged: {problem}" if problem else ""


def load_acks(state_dir: str) -> Tuple[Tuple[Ack, ...], str]:
    return _load(state_dir, ACKS, Tuple[Ack, ...], keep_acks)


def acked_until(acks: Sequence[Ack], instance: str, code: str) -> float:
    """Up to when ``instance``'s events of ``code`` are acknowledged; -inf if never."""
    return max((a.at for a in acks if a.code == code and a.instance in ("", instance)),
               default=float("-inf"))
