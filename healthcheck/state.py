"""What the health check remembers between runs (anti-flap), and what it decides from it.

The state file (``state_dir/healthcheck.state``) keeps the failed and clean runs in a
row, and whether the node is drained by us. ``decide`` is pure: from the counts, this
run's verdict and Slurm's own word where it gives one (``SLURM_NODE_IS_HEALTHY``), it
says whether slurmctld must be asked anything at all. Most runs ask nothing.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple, Optional, Tuple

from mps_health.hostio.safefiles import read_small, write_atomic
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING

STATE_FILE = "healthcheck.state"
MAX_COUNT = 1_000_000  # runs in a row: a larger saved number is as good as this


class HcState(NamedTuple):
    fails: int = 0  # failed runs in a row
    passes: int = 0  # clean runs in a row
    drained: bool = False  # we drained the node and have not seen it back in service
    last_code: str = ""  # the failure code of the last failed run
    verified_at: float = 0.0  # when we last read the node while we believed it drained
    # False when the memory was lost (no file, or a damaged one): whether the node carries
    # our drain is then unknown, and the next clean run reads the node once to learn it.
    known: bool = True
    # How long the last run took (seconds, monotonic): slurmd kills a run at 60 s.
    duration_s: float = 0.0


class Need(NamedTuple):
    action: str  # "none" | "drain" | "resume" | "forget"
    why: str


def verdict_of(state: int, drain_on: str) -> str:
    """A run's verdict: "fail", "pass" or "unknown" (the tool could not judge). The health
    check makes a pass "starting" within the boot grace while units are still starting."""
    if state == CRITICAL or (state == WARNING and drain_on == "warning"):
        return "fail"
    if state in (OK, WARNING):
        return "pass"
    return "unknown" if state == UNKNOWN else "fail"


def count(state: HcState, verdict: str, code: str = "") -> HcState:
    if verdict == "fail":
        return state._replace(fails=state.fails + 1, passes=0, last_code=code)
    if verdict == "pass":
        return state._replace(passes=state.passes + 1, fails=0)
    return state  # UNKNOWN is our own trouble, "starting" a boot: neither drains nor resumes


def decide(state: HcState, verdict: str, fail_runs: int, pass_runs: int, recheck_s: float,
           node_healthy: Optional[bool], now: float) -> Need:
    """``state`` already counts this run; ``node_healthy`` is SLURM_NODE_IS_HEALTHY
    (True yes, False no, None where Slurm does not set it)."""
    if verdict == "fail":
        if state.fails < fail_runs:
            return Need("none", f"failed run {state.fails} of {fail_runs} before draining")
        if node_healthy is True:
            return Need("drain", f"{state.fails} failed runs in a row and the node is in service")
        if node_healthy is False:
            return Need("none", "failing, and the node is already out of service")
        if not state.drained:
            return Need("drain", f"{state.fails} failed runs in a row")
        if now - state.verified_at >= recheck_s:
            return Need("drain", "still failing: make sure the node is still drained")
        return Need("none", "still failing; drained by us")
    if verdict == "pass":
        if not state.drained:
            return Need("none", "healthy")
        if node_healthy is True:
            return Need("forget", "healthy, and someone already returned the node to service")
        if state.passes < pass_runs:
            return Need("none", f"clean run {state.passes} of {pass_runs} before resuming")
        return Need("resume", f"{state.passes} clean runs in a row")
    if verdict == "starting":
        return Need("none", "the node is booting and MPS is still starting: no change")
    return Need("none", "could not judge MPS this run: no change")


def node_healthy_from_env(value: Optional[str]) -> Optional[bool]:
    """SLURM_NODE_IS_HEALTHY (Slurm 26.05.2+; unset before the node registers, on older Slurm)."""
    return {"yes": True, "no": False}.get(value or "")


def load(path: str) -> HcState:
    """The saved state; a missing or unreadable file starts afresh, not knowing whether
    the node is drained by us (never fatal)."""
    try:
        data = read_small(path, 4096)
    except OSError:
        return HcState(known=False)
    return HcState(known=False) if data is None else parse(data.decode("utf-8", "replace"))


def save_either(path: str, fallback: str, state: HcState) -> Tuple[str, str]:
    """Save to ``path``, else to ``fallback``: (where it went or "", the error or "")."""
    try:
        save(path, state)
    except OSError as e:
        problem = f"cannot save {path}: {e.strerror or e}"
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fallback)
        return path, ""
    try:
        save(fallback, state)
    except OSError as e:
        return "", f"{problem}; nor {fallback}: {e.strerror or e}"
    return fallback, problem


def parse(text: str) -> HcState:
    values = {key.strip(): value.strip()
              for key, sep, value in (line.partition("=") for line in text.splitlines()) if sep}
    if "fails" not in values:
        return HcState(known=False)
    try:
        state = HcState(fails=min(MAX_COUNT, max(0, int(values.get("fails", 0)))),
                        passes=min(MAX_COUNT, max(0, int(values.get("passes", 0)))),
                        drained=values.get("drained") == "yes",
                        last_code=_code(values.get("last_code", "")),
                        verified_at=float(values.get("verified_at", 0.0)),
                        known=values.get("known", "yes") != "no",
                        duration_s=float(values.get("duration_s", 0.0)))
    except ValueError:
        return HcState(known=False)
    # NaN or inf would switch the recheck off for good (every comparison with it is
    # false): a time we cannot trust means "never verified", so the next run reads the node.
    # A NaN, negative or absurd duration reads as 0 (not known). NaN fails every comparison.
    return state._replace(
        verified_at=state.verified_at if 0 <= state.verified_at < float("inf") else 0.0,
        duration_s=state.duration_s if 0.0 <= state.duration_s <= 1e6 else 0.0)


def _code(text: str) -> str:
    """A failure code as we write them (kebab-case, short); anything else is dropped."""
    ok = len(text) <= 64 and all(c.isalnum() or c == "-" for c in text) and text.isascii()
    return text if ok else ""


def dumps(state: HcState) -> str:
    return (f"fails={state.fails}\npasses={state.passes}\n"
            f"drained={'yes' if state.drained else 'no'}\nlast_code={state.last_code}\n"
            f"verified_at={int(state.verified_at)}\nduration_s={state.duration_s:.3f}\n"
            + ("" if state.known else "known=no\n"))


def save(path: str, state: HcState) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, dumps(state).encode(), 0o644)
