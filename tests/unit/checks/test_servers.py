"""The servers check on made facts: FAULT, stuck INITIALIZING and unreadable servers, an
instance whose servers could not be listed, and the events between two runs (a daemon
restart, a server gone under live clients) kept for the event window."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
from mps_health.checks import servers
from mps_health.model.facts_deep import (
    ClientFact,
    InstanceServers,
    RememberedServer,
    ServerEvent,
    ServerFact,
    ServerMemory,
    ServersFacts,
)
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, Result

from .made import GPU0, NODE, NOW, codes, run

RESET = "'mps-health remediate reset node' (dry run first: --dry-run)"
CLIENT = ClientFact(5001, 1002, "mpshvictim", 50010)


def server(pid: int = 4000, status: str = "ACTIVE", clients: Tuple[ClientFact, ...] = (CLIENT,),
           detail: str = "") -> ServerFact:
    return ServerFact(pid, status, detail, 1002, "mpshvictim", pid * 10, clients)


def listed(*found: ServerFact, query: str = "ok", detail: str = "",
           daemon_pid: int = 100) -> InstanceServers:
    return InstanceServers(query, detail, daemon_pid, 1000, found, 0.01)


def judge(cur: Optional[InstanceServers], previous: Optional[ServerMemory] = None,
          alive: Tuple[Tuple[int, int], ...] = (), cfg: Optional[Dict[str, Any]] = None,
          state_error: str = "") -> List[Result]:
    sf = ServersFacts(NOW, {} if cur is None else {"node": cur},
                      {} if previous is None else {"node": previous}, alive, state_error)
    return run(servers, {"servers": sf}, cfg=cfg)


def memory(*remembered: RememberedServer, daemon_pid: int = 100,
           at: float = NOW - 60) -> ServerMemory:
    return ServerMemory(at, daemon_pid, 1000, remembered)


def test_active_servers_are_ok_with_their_counts() -> None:
    (r,) = judge(listed(server()))
    assert (r.state, r.code) == (OK, "ok")
    assert r.message == "server 4000 (mpshvictim) with clients 5001 (mpshvictim): ACTIVE"
    assert dict(r.values) == {"servers": 1.0, "clients": 1.0, "servers_fault": 0.0,
                              "servers_initializing": 0.0}
    assert judge(listed(query="idle"))[0].message == "no server running"


def test_a_server_in_fault_is_critical() -> None:
    (r,) = judge(listed(server(status="FAULT")))
    assert (r.state, r.code) == (CRITICAL, "server-fault")
    assert "server 4000 (mpshvictim) with clients 5001 (mpshvictim) is in FAULT: new " \
        "clients get CUDA_ERROR_MPS_SERVER_NOT_READY" in r.message
    assert RESET in r.action and dict(r.values)["servers_fault"] == 1.0


def test_a_server_initializing_past_the_limit_is_stuck() -> None:
    seen = RememberedServer(4000, 40000, "INITIALIZING", NOW - 90, "mpshvictim", ())
    (r,) = judge(listed(server(status="INITIALIZING")), memory(seen))
    assert (r.state, r.code) == (CRITICAL, "server-stuck-initializing")
    assert "has been INITIALIZING for 90s (limit 60s): its clients wait forever" in r.message
    assert dict(r.values)["initializing_s"] == 90.0
    # Within the limit, or first seen now: still starting, not stuck.
    assert judge(listed(server(status="INITIALIZING")), memory(seen),
                 cfg={"servers": {"init_stuck_s": 120}})[0].code == "ok"
    assert judge(listed(server(status="INITIALIZING")))[0].code == "ok"


def test_a_server_whose_status_query_failed_is_unreadable() -> None:
    (r,) = judge(listed(server(status="error", detail="get_server_status: timed out")))
    assert (r.state, r.code) == (UNKNOWN, "server-unreadable")
    assert r.message == "server 4000: get_server_status: timed out"


def test_an_instance_whose_servers_could_not_be_listed() -> None:
    (r,) = judge(listed(query="timeout", detail="no answer within 2.0s"))
    assert (r.state, r.code) == (UNKNOWN, "servers-not-asked")
    assert r.message == "cannot list the servers (timeout: no answer within 2.0s)"
    found = run(servers, {"servers": ServersFacts(NOW, {"node": listed()}, {}, ())},
                (NODE, GPU0))
    assert codes(found) == [("node", OK, "ok"), ("gpu0", UNKNOWN, "servers-not-asked")]
    assert "no server query was made" in found[1].message


def test_a_daemon_changed_since_the_last_run_is_a_restart() -> None:
    (r,) = judge(listed(server(), daemon_pid=200), memory(daemon_pid=100))
    assert (r.state, r.code) == (WARNING, "daemon-restarted")
    assert "the control daemon changed since the last run (was 100, now 200): its clients " \
        "lost MPS (0 min ago)" in r.message
    assert "'mps-health ack daemon-restarted node'" in r.action
    assert dict(r.values)["events"] == 1.0


def test_a_server_gone_under_live_clients_is_churn() -> None:
    gone = RememberedServer(3000, 30000, "ACTIVE", NOW - 600, "mpshvictim", ((5001, 50010),))
    (r,) = judge(listed(server()), memory(gone), alive=((5001, 50010),))
    assert (r.state, r.code) == (WARNING, "server-churn")
    assert "went away while its clients 5001 still run (no job ended)" in r.message
    # Its clients gone too: a job ended, no churn.
    assert judge(listed(server()), memory(gone))[0].code == "ok"


@pytest.mark.parametrize("code", ["daemon-restarted", "server-churn"])
def test_events_stay_for_the_window_even_when_the_servers_cannot_be_listed(code: str) -> None:
    old = ServerMemory(NOW - 60, 100, 1000, (),
                       (ServerEvent(NOW - 600, code, "x"), ServerEvent(NOW - 300, code, "y")))
    found = judge(listed(query="absent", detail="no daemon"), old)
    assert [(r.state, r.code) for r in found] == [(UNKNOWN, "servers-not-asked"), (WARNING, code)]
    assert "2 times, first 10 min ago, last 5 min ago; the last: y" in found[1].message
    window = {"servers": {"event_window_s": 400}}
    assert [r.code for r in judge(listed(query="absent"), old, cfg=window)] == \
        ["servers-not-asked", code]
    assert [r.code for r in judge(listed(query="absent"), old,
                                  cfg={"servers": {"event_window_s": 200}})] == \
        ["servers-not-asked"]


def test_a_state_that_cannot_be_kept_is_said_in_a_note() -> None:
    found = judge(listed(), state_error="cannot write servers.json: read-only")
    assert codes(found)[0] == ("", OK, "history-not-saved")
    assert found[0].message == "server history: cannot write servers.json: read-only"


def test_no_instance_is_ok() -> None:
    assert codes(run(servers, {"servers": ServersFacts(NOW, {}, {}, ())}, ())) == \
        [("", OK, "ok")]
