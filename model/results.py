"""Evaluation stage: what checks say, and how states combine.

States use the Nagios exit codes; combined, CRITICAL outranks WARNING, which outranks
UNKNOWN, which outranks OK (monitoring-plugins' ``max_state_alt``): a node with one
broken daemon and one unreadable fact is broken, not unknown.

A finding that only follows from another (no MPS binaries: no daemon made its dirs) is
folded under that cause (``fold``): it keeps check, code, state and message, names its
cause in ``cause`` and loses its action. It is no problem of its own: the report's state,
its problems and each check's state count only the rest, so summary, exit code, Nagios,
metrics and health check agree; text shows folded findings with ``-v``, JSON with ``cause``.
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Mapping, NamedTuple, Optional, Sequence, Tuple

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATE_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
_RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}


# A command an action advises, as its argv (engine/actionhints.py quotes it).
Command = Tuple[str, ...]


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
    # The code of the finding this one follows from (see ``fold``); "" for one that counts.
    cause: str = ""
    # The mps-health commands ``action`` quotes, as argv, in its order (see
    # engine/actionhints.py): the run's options are added to them, never to the text.
    commands: Tuple[Command, ...] = ()


def is_problem(r: Result) -> bool:
    """A finding that counts: not OK, and not folded under its cause."""
    return r.state != OK and not r.cause


# Cause code -> the codes that follow from it on the same instance (and the node's own,
# instance ""). Only consequences, never what a user could cause (a link, a foreign
# entry, an impostor): folding hides nothing an attack shows.
CANARY_WITHOUT_DAEMON = frozenset(("canary-not-served", "canary-failed", "canary-not-run"))
WITHOUT_DAEMON = CANARY_WITHOUT_DAEMON | frozenset((
    "control-absent", "servers-not-asked", "pipe-dir-missing", "log-dir-missing"))
HELD = frozenset(("control-wedged", "control-busy", "servers-not-asked", "canary-timeout",
                  "canary-not-served", "canary-failed", "canary-not-run",
                  "log-accept-failed"))
FOLDS: Mapping[str, FrozenSet[str]] = {
    # No control binary: no daemon made the dirs or answers; "run reset" would refuse.
    "mps-not-installed": frozenset((
        "control-client-missing", "pipe-dir-missing", "log-dir-missing",
        "servers-not-asked", "canary-not-served", "canary-not-run", "canary-no-libcuda",
        "mps-gpu-no-daemon", "mps-gpu-unserved", "mps-job-no-daemon",
        # the binaries went after a daemon ran: its restart (the upgrade's) is the same cause
        "daemon-restarted")),
    # The control binary is there but cannot run (no program for this machine, a missing
    # interpreter, loader or library): no daemon of it can run either, and a reset would
    # only fail to start one; the one fix is the binaries.
    "control-client-broken": frozenset((
        "daemon-absent", "daemon-stale", "pipe-dir-missing", "log-dir-missing",
        "servers-not-asked", "canary-not-served", "canary-not-run", "canary-no-libcuda",
        "canary-failed", "mps-gpu-no-daemon", "mps-gpu-unserved", "mps-job-no-daemon")),
    # No control daemon: the control client finds none, its servers cannot be asked, the
    # dirs its unit makes are not there (the reset the cause advises mends them all); a
    # CUDA client runs without MPS or cannot connect, all the canary can say.
    "daemon-absent": WITHOUT_DAEMON,
    "daemon-stale": WITHOUT_DAEMON,
    # A held daemon answers no one: every query and client waits, all they can say.
    "daemon-stopped": HELD,
    "blocked-connection": HELD,
    "blocked-server": HELD,
    "blocked-foreign-server": HELD | {"server-stopped-foreign"},
}


# Within ``healthcheck.boot_grace_s`` of boot, what only says a unit is not up yet (no
# daemon, dir or answer) is marked ``cause=STARTING``: like a folded finding it counts for
# no state, drains nothing, and shows as starting (INITIALIZING). A wrong owner, mode,
# link or stranger is never here: booting explains none of those.
STARTING = "starting"
# healthcheck.boot_grace_s's default, here for a check run without a config file.
BOOT_GRACE_S = 300.0
STARTING_CODES: FrozenSet[str] = frozenset((
    "daemon-absent", "daemon-stale", "pipe-dir-missing",
    "log-dir-missing", "control-absent", "servers-not-asked", "mps-gpu-no-daemon",
    "mps-gpu-unserved", "canary-not-served", "canary-not-run"))


def starting(runs: Sequence[CheckRun]) -> Tuple[CheckRun, ...]:
    """``runs`` with every finding of ``STARTING_CODES`` that still counts marked as
    starting (the node is within its boot grace); any other finding is left as it is."""
    return _mark(runs, lambda r: STARTING if r.code in STARTING_CODES else "")


def _mark(runs: Sequence[CheckRun], cause_of: Callable[[Result], str]
          ) -> Tuple[CheckRun, ...]:
    """``runs`` with each finding that counts and has a ``cause_of`` given it, action cleared."""
    return tuple(run._replace(results=tuple(
        r._replace(cause=cause, action="") if is_problem(r) and (cause := cause_of(r)) else r
        for r in run.results)) for run in runs)


class CheckRun(NamedTuple):
    """One check's run: its results, whether it could run, and what it cost."""

    name: str
    results: Tuple[Result, ...]
    duration_s: float
    error: Optional[str] = None  # set when the check itself failed (then UNKNOWN)

    @property
    def state(self) -> int:
        return worst([r.state for r in self.results if not r.cause])


# Causes whose own state stands for all that follows from them (MPS cannot run here: a
# per-job instance's is a WARNING, whatever its missing dirs say). Under any other cause
# a finding more severe than the cause stays a problem of its own: folding never makes
# the verdict milder (a per-job daemon-absent is a WARNING, its control-absent CRITICAL).
CAUSE_DECIDES = frozenset(("mps-not-installed",))


def fold(runs: Sequence[CheckRun]) -> Tuple[CheckRun, ...]:
    """``runs`` with every finding that follows from another (``FOLDS``) folded under it:
    an instance's under its own cause, the node's own (instance "") under any instance's;
    one more severe than its cause only under a cause of ``CAUSE_DECIDES``."""
    # (instance, folded code) -> its cause's code and state
    causes: Dict[Tuple[str, str], Tuple[str, int]] = {}
    for run in runs:
        for r in run.results:
            for code in FOLDS.get(r.code, ()) if is_problem(r) else ():
                causes.setdefault((r.instance, code), (r.code, r.state))
                causes.setdefault(("", code), (r.code, r.state))
    if not causes:
        return tuple(runs)

    def cause_of(r: Result) -> str:
        code, state = causes.get((r.instance, r.code), ("", OK))
        return code if code in CAUSE_DECIDES or _RANK[r.state] <= _RANK[state] else ""

    return _mark(runs, cause_of)


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
    # (option, value) of the run that change what a command acts on (--config, --root):
    # the actions' commands carry them (engine/actionhints.py).
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def state(self) -> int:
        return worst([r.state for r in self.runs])

    def problems(self) -> Tuple[Result, ...]:
        """The findings that count (folded ones are not: see ``fold``)."""
        return tuple(r for run in self.runs for r in run.results if is_problem(r))


def ok(check: str, instance: str, message: str, **values: float) -> Result:
    return Result(check, OK, "ok", instance, message, "", tuple(values.items()))
