"""The logs check on made log facts: each kind of finding within the window, a pending
client until it exits or its user's server starts, log files and entries that are not
the daemon's, and logs that cannot be read."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from mps_health.checks import logs
from mps_health.model.facts_deep import LogFileFact, LogFinding, LogsFacts
from mps_health.model.results import OK, UNKNOWN, WARNING, Result

from .made import NODE, NOW, codes, run

LOG = NODE.log_dir
CONTROL_LOG = f"{LOG}/control.log"


def finding(code: str, ago: float = 60.0, text: str = "the line", pid: int = 0,
            uid: int = -1, log_dir: str = LOG) -> LogFinding:
    return LogFinding(NOW - ago, code, log_dir, "control.log", text, pid, uid)


def judge(findings: Sequence[LogFinding] = (), files: Sequence[LogFileFact] = (),
          alive: Tuple[int, ...] = (), foreign: Sequence[LogFileFact] = (),
          cfg: Optional[Dict[str, Any]] = None, state_error: str = "") -> List[Result]:
    lf = LogsFacts(NOW, tuple(files) or (LogFileFact(CONTROL_LOG, "read", bytes_read=10),),
                   tuple(findings), alive, state_error, tuple(foreign))
    return run(logs, {"logs": lf}, cfg=cfg)


def test_nothing_notable_is_ok() -> None:
    (r,) = judge([finding("log-server-start", uid=1002)])
    assert (r.state, r.code) == (OK, "ok")
    assert r.message == "nothing notable in the last 15 min"
    assert dict(r.values) == {"log_findings": 0.0, "pending_clients": 0.0}


@pytest.mark.parametrize("code, meaning, action", [
    ("log-server-exit", "MPS server(s) exited with a non-zero status",
     "run 'mps-health remediate reset node'"),
    ("log-daemon-exit", "the control daemon exited with a non-zero status", "read control.log"),
    ("log-server-start-failed", "the daemon failed to start a server for a user",
     "CUDA_MPS_PIPE_DIRECTORY"),
    ("log-accept-failed", "the control daemon could not accept connections",
     "run 'mps-health remediate reset node'"),
    ("log-fatal", "fatal errors or exceptions were logged", "Xid errors"),
])
def test_each_finding_within_the_window(code: str, meaning: str, action: str) -> None:
    (r,) = judge([finding(code, 600, "first"), finding(code, 120, "the last line"),
                  finding(code, 2000, "out of the window")])
    assert (r.instance, r.state, r.code) == ("node", WARNING, code)
    clock = time.strftime("%H:%M:%S", time.localtime(NOW - 120))
    assert r.message == f"2 in the last 15 min: {meaning}; last at {clock} in control.log: " \
        "the last line"
    assert action in r.action
    assert dict(r.values)[code.replace("-", "_")] == 2.0
    assert judge([finding(code, 2000)])[0].code == "ok"  # out of the window: cleared


def test_a_client_pending_too_long_is_a_warning_until_it_is_served() -> None:
    pending = finding("log-pending-client", 90, pid=5001, uid=1002)
    (r,) = judge([pending], alive=(5001,))
    assert (r.state, r.code) == (WARNING, "client-pending")
    assert "client 5001 of uid 1002 was pushed to the pending list at" in r.message
    assert "has waited 90s: another user's server holds the GPU" in r.message
    assert dict(r.values)["pending_wait_s"] == 90.0
    # Not yet long enough; exited; its user's server started since: nothing to say.
    assert judge([pending], alive=(5001,), cfg={"logs": {"pending_warn_s": 120}})[0].code == "ok"
    assert judge([pending])[0].code == "ok"
    started = finding("log-server-start", 30, uid=1002)
    assert judge([pending, started], alive=(5001,))[0].code == "ok"


def test_a_log_file_that_is_not_the_daemons_is_bad_and_not_read() -> None:
    bad = LogFileFact(CONTROL_LOG, "bad", "a symlink", uid=1001)
    found = judge(files=[bad])
    assert [(r.state, r.code) for r in found] == [(WARNING, "log-file-bad"), (OK, "ok")]
    assert found[0].message == f"{CONTROL_LOG} is a symlink, not the daemon's own log: not read"
    assert found[0].action.startswith("ask uid 1001 why")


def test_other_entries_in_the_log_dir_are_foreign() -> None:
    planted = [LogFileFact(f"{LOG}/x{i}", "foreign", "a symlink", uid=1001 + i % 2)
               for i in range(7)]
    found = judge(foreign=planted)
    assert [(r.state, r.code) for r in found] == [(WARNING, "log-entry-foreign"), (OK, "ok")]
    assert found[0].message.startswith(f"7 entries in log dir {LOG} not the daemon's")
    assert found[0].message.endswith("and 2 more")
    assert found[0].action.startswith("ask uid 1001, uid 1002 why")


def test_logs_that_cannot_be_read_are_unknown() -> None:
    err = [LogFileFact(CONTROL_LOG, "error", "Permission denied"),
           LogFileFact(f"{LOG}/server.log", "error", "Permission denied")]
    (r,) = judge(files=err)
    assert (r.state, r.code) == (UNKNOWN, "logs-unreadable")
    assert r.message == f"{CONTROL_LOG}: Permission denied; {LOG}/server.log: Permission denied"
    # One readable file is enough to judge.
    assert judge(files=[err[0], LogFileFact(f"{LOG}/server.log", "read")])[0].code == "ok"


def test_offsets_that_cannot_be_kept_are_said_in_a_note() -> None:
    found = judge(state_error="cannot write logs.json")
    assert codes(found) == [("node", OK, "ok"), ("", OK, "history-not-saved")]
    assert found[1].message == "log offsets: cannot write logs.json"


def test_a_refused_connection_right_after_mps_health_freed_the_daemon_is_no_finding() -> None:
    from mps_health.hostio.unblocks import Unblocked
    from mps_health.probes.blockers import BlockerFacts

    # Clients killed while the daemon was held (our own timed-out query among them) are
    # refused once it is freed: that echo of the freeing is no fault of the daemon's.
    lines = [finding("log-accept-failed", ago=100.0)]
    freed = BlockerFacts({}, (Unblocked(NOW - 101.0, 1001, "alice", NODE.name, "connection"),))
    lf = LogsFacts(NOW, (LogFileFact(CONTROL_LOG, "read", bytes_read=10),), tuple(lines), (),
                   "", ())
    assert codes(run(logs, {"logs": lf, "blockers": freed})) == [("node", OK, "ok")]
    later = BlockerFacts({}, (Unblocked(NOW - 900.0, 1001, "alice", NODE.name, "connection"),))
    assert ("node", WARNING, "log-accept-failed") in codes(run(logs, {"logs": lf,
                                                                      "blockers": later}))
