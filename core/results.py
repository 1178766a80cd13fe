"""Evaluation stage: what checks say, and how states combine.

States use the Nagios exit codes. When states combine, CRITICAL outranks WARNING,
which outranks UNKNOWN, which outranks OK (monitoring-plugins' ``max_state_alt``):
a node with one broken daemon and one unreadable fact is broken, not unknown.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple
else:
    from .frozen import NamedTuple

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATE_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
_RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}


def worst(states: Sequence[int]) -> int:
    """The state that wins when several are combined (OK for none)."""
    return max(states, key=_RANK.__getitem__, default=OK)


class Result(NamedTuple):
    """One finding of one check about one instance (or the node: instance "")."""

    check: str
    state: int
    code: str  # short, stable: alerts, drain reasons and the runbook use it
    instance: str
    message: str
    action: str = ""  # what to run or do; empty for OK
    # Numbers for perfdata and metrics (latency_s, clients, ...), never needed to judge.
    values: Tuple[Tuple[str, float], ...] = ()
    # Extra identity of what the values describe, e.g. (("gpu", "0"), ("UUID", "GPU-...")):
    # Prometheus labels and Nagios perfdata label parts (see docs/metrics.md).
    labels: Tuple[Tuple[str, str], ...] = ()


class CheckRun(NamedTuple):
    """One check's run: its results, whether it could run, and what it cost."""

    name: str
    results: Tuple[Result, ...]
    duration_s: float
    error: Optional[str] = None  # set when the check itself failed (then UNKNOWN)

    @property
    def state(self) -> int:
        return worst([r.state for r in self.results])


class Report(NamedTuple):
    """The whole verdict of one run: what outputs format."""

    node: str
    started_at: float
    duration_s: float
    runs: Tuple[CheckRun, ...]
    gather_s: Dict[str, float]
    version: str
    # Instance name -> its GPU (index or UUID), where it has one: outputs label by it.
    instance_gpus: Mapping[str, str] = {}
    # The run's options that change what a command acts on (--config, --root), as
    # (option, value): the actions quote them (core/actionhints.py), so may an output.
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def state(self) -> int:
        return worst([r.state for r in self.runs])

    def problems(self) -> Tuple[Result, ...]:
        return tuple(r for run in self.runs for r in run.results if r.state != OK)


def ok(check: str, instance: str, message: str, **values: float) -> Result:
    return Result(check, OK, "ok", instance, message, "", tuple(values.items()))
