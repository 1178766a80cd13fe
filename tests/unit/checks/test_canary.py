"""The canary check on made facts: each status the canary probe gives, and an instance
the canary did not reach within the run's budget."""

from __future__ import annotations

import pytest
from mps_health.checks import canary
from mps_health.model.facts_deep import CanaryFact
from mps_health.model.results import CRITICAL, OK, UNKNOWN

from .made import GPU0, NODE, codes, run

RESET = "mps-health remediate reset node"


def judge(status: str, detail: str = "", **kw: object) -> canary.Result:
    (r,) = run(canary, {"canary": {"node": CanaryFact(status, detail, 1002, **kw)}})
    return r


def test_a_served_canary_is_ok_with_its_latency() -> None:
    r = judge("served", "server 4321", pid=77, latency_s=0.25, total_s=1.5, server_pid=4321)
    assert (r.state, r.code) == (OK, "ok")
    assert "pid 77, uid 1002" in r.message and "250 ms" in r.message
    assert dict(r.values) == {"canary_served": 1.0, "canary_skipped": 0.0,
                              "canary_latency_s": 0.25, "canary_total_s": 1.5}


@pytest.mark.parametrize("status, state, code, wording, action", [
    ("skipped", OK, "canary-skipped", "canary not run: clients of uid 1003", ""),
    ("not-served", CRITICAL, "canary-not-served", "no MPS server listed it", RESET),
    ("failed", CRITICAL, "canary-failed", "the canary's clients of uid 1003 through MPS", RESET),
    ("timeout", CRITICAL, "canary-timeout", "the canary got clients of uid 1003", RESET),
    ("not-run", UNKNOWN, "canary-not-run", "canary not run: clients of uid 1003",
     "hung mps-health process"),
    ("no-libcuda", UNKNOWN, "canary-no-libcuda", "libcuda.so.1 not found",
     "install the NVIDIA driver"),
    ("error", UNKNOWN, "canary-error", "clients of uid 1003", "--only canary -v"),
    ("anything else", UNKNOWN, "canary-error", "clients of uid 1003", "--only canary -v"),
])
def test_each_status(status: str, state: int, code: str, wording: str, action: str) -> None:
    r = judge(status, "clients of uid 1003", pid=77, latency_s=0.5)
    assert (r.instance, r.state, r.code) == ("node", state, code)
    assert wording in r.message
    assert action in r.action and (action or r.action == "")
    assert dict(r.values)["canary_skipped"] == (1.0 if status == "skipped" else 0.0)


def test_not_served_says_clients_run_without_mps() -> None:
    r = judge("not-served", pid=77, latency_s=0.123)
    assert r.code == "canary-not-served"
    assert "pid 77" in r.message and "123 ms" in r.message and "without MPS" in r.message


def test_an_instance_the_canary_did_not_reach_is_not_run() -> None:
    found = run(canary, {"canary": {"node": CanaryFact("served", "", 0, latency_s=0.1)}},
                (NODE, GPU0))
    assert codes(found) == [("node", OK, "ok"), ("gpu0", UNKNOWN, "canary-not-run")]
    assert "within the run's budget" in found[1].message
    assert "budget_s" in found[1].action


def test_no_instance_is_ok() -> None:
    assert codes(run(canary, {"canary": {}}, ())) == [("", OK, "ok")]
