"""logs: what the MPS logs said lately: pending clients, failed servers, refused connections.

Findings (``probes.logs``) stay reported for ``logs.window_s`` after their time, then
clear. A pending client is reported once it waited ``logs.pending_warn_s``, until it
exits or a server starts for its user (MPS serves one user per GPU at a time).

Only the daemon writes in its log dir. A control.log or server.log that is not its
user's regular file (a forged log) is never read and is a WARNING (``log-file-bad``), as
is any other link or other user's entry there (``log-entry-foreign``): never CRITICAL.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Iterator, List, Tuple

from mps_health.checks.common import group, some
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import RESET, VERBOSE, Advice, advice, quoted
from mps_health.model.facts import Facts
from mps_health.model.facts_deep import LogFileFact, LogFinding, LogsFacts
from mps_health.model.results import OK, UNKNOWN, WARNING, Result, ok
from mps_health.probes.logs import settings

NAME = "logs"
CODES = ("client-pending", "log-accept-failed", "log-daemon-exit", "log-entry-foreign",
         "log-fatal", "log-file-bad", "log-server-exit", "log-server-start-failed",
         "logs-unreadable", "history-not-saved")  # the last: a note (OK), as the servers'

registry.check(NAME, f"{__name__}:check", ("logs",), order=80,
               summary="no pending clients, failed servers or refused connections in the MPS logs")

SHOWN_FOREIGN = 5  # entries named per log dir; the rest are counted

# code -> (state, what it means, what to do for the instance named)
MEANING: Dict[str, Tuple[int, str, Callable[[str], Advice]]] = {
    "log-server-exit": (WARNING, "MPS server(s) exited with a non-zero status",
                        lambda name: advice("read server.log and control.log around that "
                                            "time; if it repeats, run ", (*RESET, name))),
    "log-daemon-exit": (WARNING, "the control daemon exited with a non-zero status",
                        lambda name: advice("read control.log; ", ("mps-health", "check"),
                                            " shows whether it runs again")),
    "log-server-start-failed": (WARNING, "the daemon failed to start a server for a user",
                                lambda name: Advice(
                                    "a client of another user reached a per-user daemon: "
                                    "check that each job's CUDA_MPS_PIPE_DIRECTORY is its "
                                    "own daemon's")),
    "log-accept-failed": (WARNING, "the control daemon could not accept connections",
                          lambda name: advice("check open files and the pipe dir; if it "
                                              "repeats, run ", (*RESET, name))),
    "log-fatal": (WARNING, "fatal errors or exceptions were logged",
                  lambda name: Advice("read server.log around that time and check dmesg for "
                                      "Xid errors")),
}


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def judge(name: str, findings: List[LogFinding], lf: LogsFacts, config: Config) -> Iterator[Result]:
    cfg = settings(config)
    now = lf.taken_at
    recent = [f for f in findings if now - f.at <= cfg.window_s]
    # The last server start per log dir and uid, indexed once: many findings stay linear.
    started: Dict[Tuple[str, int], float] = {}
    for f in findings:
        if f.code == "log-server-start":
            started[f.log_dir, f.uid] = max(f.at, started.get((f.log_dir, f.uid), f.at))
    alive = set(lf.alive)
    # Still waiting: the client runs (not served, given up or killed), no server of its
    # user started in its log dir since, and it waited long enough to tell.
    waiting = [p for p in findings if p.code == "log-pending-client" and p.pid in alive
               and started.get((p.log_dir, p.uid), float("-inf")) < p.at
               and now - p.at >= cfg.pending_warn_s]
    values = (("log_findings", float(sum(f.code in MEANING for f in recent))),
              ("pending_clients", float(len(waiting))))
    by_code = group((f for f in recent if f.code in MEANING), lambda f: f.code)
    for p in waiting[:8]:
        yield Result(NAME, WARNING, "client-pending", name,
                     f"client {p.pid} of uid {p.uid} was pushed to the pending list at "
                     f"{_clock(p.at)} and has waited {now - p.at:.0f}s: another user's "
                     "server holds the GPU (MPS serves one user per GPU at a time)",
                     f"check which jobs share the GPU ({quoted(VERBOSE)}, squeue -w this "
                     "node); MPS GPUs should be allocated to one user at a time",
                     (*values, ("pending_wait_s", now - p.at)), commands=(VERBOSE,))
    for code, same in by_code.items():
        state, meaning, todo = MEANING[code]
        last = max(same, key=lambda f: f.at)
        action = todo(name)
        yield Result(NAME, state, code, name,
                     f"{len(same)} in the last {cfg.window_s / 60:g} min: {meaning}; last at "
                     f"{_clock(last.at)} in {last.file}: {last.text}",
                     action.text, (*values, (code.replace("-", "_"), float(len(same)))),
                     commands=action.commands)
    if not waiting and not by_code:
        yield Result(NAME, OK, "ok", name, f"nothing notable in the last {cfg.window_s / 60:g} min",
                     "", values)


def planted(name: str, log_dir: str, files: List[LogFileFact],
            foreign: List[LogFileFact]) -> Iterator[Result]:
    """WARNINGs for log files that are not the daemon's, and others' entries in its dir."""
    for f in files:
        if f.status == "bad":
            reset = (*RESET, name)
            yield Result(NAME, WARNING, "log-file-bad", name,
                         f"{f.path} is {f.detail}, not the daemon's own log: not read",
                         f"ask uid {f.uid} why; run {quoted(reset)} (it moves it aside, or "
                         "removes the link, before the daemon starts), and make the log dir "
                         f"{log_dir} writable by no one else", (("log_files_bad", 1.0),),
                         commands=(reset,))
    if foreign:
        shown = some([f"{f.path} ({f.detail})" for f in foreign], SHOWN_FOREIGN, "; ")
        owners = ", ".join(f"uid {u}" for u in sorted({f.uid for f in foreign}))
        yield Result(NAME, WARNING, "log-entry-foreign", name,
                     f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} in log dir "
                     f"{log_dir} not the daemon's (links or other users', never read): {shown}",
                     f"ask {owners} why they are there and remove them; make the log dir "
                     "writable by no one else (mps.log_dir_mode)",
                     (("log_entries_foreign", float(len(foreign))),))


# A client that waited on a held daemon and was killed (our own timed-out query among
# them) leaves "Unable to accept connection" once the daemon is freed: within this long
# after mps-health freed it, the line is that, not a fault of the daemon's.
FREED_ECHO_S = 30.0


def freed_at(facts: Facts, name: str) -> List[float]:
    """When mps-health freed ``name``'s daemon lately (the blockers source, when gathered)."""
    found = facts.sources.get("blockers")
    return [u.at for u in getattr(found, "recent", ()) if u.instance == name]


def ours_excused(findings: List[LogFinding], freed: List[float]) -> List[LogFinding]:
    return [f for f in findings if f.code != "log-accept-failed"
            or not any(t - 5.0 <= f.at <= t + FREED_ECHO_S for t in freed)]


def check(facts: Facts, config: Config) -> Iterator[Result]:
    lf: LogsFacts = facts.sources["logs"]  # type: ignore[assignment]
    # By dir once, not a scan of every file and finding per instance.
    files_in = group(lf.files, lambda f: os.path.dirname(f.path))
    foreign_in = group(lf.foreign, lambda f: os.path.dirname(f.path))
    findings_in = group(lf.findings, lambda f: f.log_dir)
    done = set()
    for inst in facts.instances:
        if inst.log_dir in done:
            continue
        done.add(inst.log_dir)
        where = inst.log_dir.rstrip("/") or "/"
        files = files_in.get(where, [])
        if files and all(f.status == "error" for f in files):
            yield Result(NAME, UNKNOWN, "logs-unreadable", inst.name,
                         "; ".join(f"{f.path}: {f.detail}" for f in files), "run the check as root")
            continue
        yield from planted(inst.name, inst.log_dir, files, foreign_in.get(where, []))
        yield from judge(inst.name, ours_excused(findings_in.get(inst.log_dir, []),
                                                 freed_at(facts, inst.name)), lf, config)
    if lf.state_error:
        yield Result(NAME, OK, "history-not-saved", "", f"log offsets: {lf.state_error}")
    if not facts.instances:
        yield ok(NAME, "", "no MPS instance on this node")
