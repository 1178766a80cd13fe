"""The control check on made answers: each status of the run's control query, the
percentage and latency bounds, and an instance that was not asked."""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest
from mps_health.checks import control
from mps_health.model.facts import ControlAnswer
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, Result
from mps_health.probes.control import QUERY

from .made import GPU0, NODE, codes, run

RESET = "'mps-health remediate reset node' (dry run first: --dry-run)"


def answer(status: str = "ok", stdout: str = "100.0\n", latency: float = 0.01,
           detail: str = "") -> ControlAnswer:
    return ControlAnswer(QUERY, status, 0 if status == "ok" else 1, stdout, "", latency, detail)


def judge(a: ControlAnswer, cfg: Optional[Dict[str, Any]] = None) -> Result:
    (r,) = run(control, {"control": {"node": a}}, cfg=cfg)
    return r


def test_a_prompt_answer_is_ok_with_its_values() -> None:
    r = judge(answer(latency=0.012))
    assert (r.state, r.code) == (OK, "ok")
    assert "answered in 12 ms (default active thread percentage 100)" in r.message
    assert dict(r.values) == {"latency_s": 0.012, "thread_percentage": 100.0}


@pytest.mark.parametrize("status, state, code, wording", [
    ("exec-failed", UNKNOWN, "control-client-missing", "nvidia-cuda-mps-control: command not found"),
    ("skipped", UNKNOWN, "control-busy", "nvidia-cuda-mps-control: command not found"),
    ("timeout", CRITICAL, "control-wedged", "did not answer within 2.0s (wedged"),
    ("absent", CRITICAL, "control-absent", "cannot find a control daemon for this pipe dir"),
    ("error", CRITICAL, "control-error",
     "answered with an error: nvidia-cuda-mps-control: command not found"),
])
def test_each_failed_query(status: str, state: int, code: str, wording: str) -> None:
    r = judge(answer(status, "", 2.0, "nvidia-cuda-mps-control: command not found"))
    assert (r.instance, r.state, r.code) == ("node", state, code)
    assert wording in r.message
    if state == CRITICAL:
        assert RESET in r.action and dict(r.values) == {"latency_s": 2.0}


def test_actions_of_the_unknowns() -> None:
    missing = answer("exec-failed", detail="nvidia-cuda-mps-control: command not found")
    assert "commands.nvidia-cuda-mps-control" in judge(missing).action
    assert "another mps-health run" in judge(answer("skipped")).action


def test_a_percentage_other_than_the_expected_is_a_warning() -> None:
    r = judge(answer(stdout="50.0\n"), {"control": {"expected_thread_percentage": 100}})
    assert (r.state, r.code) == (WARNING, "control-percentage")
    assert "is 50, expected 100" in r.message
    assert "set_default_active_thread_percentage 100" in r.action
    assert judge(answer(stdout="99.96\n"),
                 {"control": {"expected_thread_percentage": 100}}).code == "ok"


def test_a_slow_answer_is_a_warning() -> None:
    r = judge(answer(latency=0.75))
    assert (r.state, r.code) == (WARNING, "control-slow")
    assert "took 0.75s to answer (warning above 0.5s)" in r.message
    assert judge(answer(latency=0.75), {"control": {"warn_latency_s": 1}}).code == "ok"


def test_an_instance_not_asked_is_unknown() -> None:
    found = run(control, {"control": {"node": answer()}}, (NODE, GPU0))
    assert codes(found) == [("node", OK, "ok"), ("gpu0", UNKNOWN, "control-not-asked")]
    assert "no control query was made" in found[1].message


@pytest.mark.parametrize("why", [
    "built for another architecture (ELF machine 183, this node is x86_64)",
    "its loader /lib64/ld-linux-x86-64.so.2 is missing",
    "its interpreter /nonexistent is missing",
    "error while loading shared libraries: libcuda.so.1: cannot open shared object file",
])
def test_a_client_that_is_there_but_cannot_run_is_critical_and_no_reset(why: str) -> None:
    detail = f"/usr/bin/nvidia-cuda-mps-control: cannot run: {why}"
    r = judge(answer("exec-failed", "", 0.0, detail))
    assert (r.state, r.code) == (CRITICAL, "control-client-broken")
    assert r.message == ("the MPS control client is there but cannot run, so no query can "
                         f"be made: {detail}")
    assert r.action.startswith(f"reinstall the NVIDIA driver's MPS binaries ({detail})")
    assert RESET not in r.action and not r.values
