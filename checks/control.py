"""control: the daemon answers get_default_active_thread_percentage within its bound.

Absent (the client's rc 1 'Cannot find MPS control daemon process'), erroring (any
other output: the client exits 0 on errors) and wedged (no answer: a stopped daemon
makes the client hang forever) are different failures with different codes; so are a
client not found and one that is there but cannot run (another architecture, its loader
or a library missing: ``hostio.executable``), where no query is made at all.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from mps_health.checks.common import reset_action
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import Advice
from mps_health.model.facts import ControlAnswer, Facts
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, Result, ok

NAME = "control"
CODES = ("control-absent", "control-busy", "control-client-broken", "control-client-missing",
         "control-error",
         "control-not-asked", "control-percentage", "control-slow", "control-wedged")

registry.check(NAME, f"{__name__}:check", ("control",), order=30,
               summary="the control daemon answers in time")


def judge(name: str, answer: ControlAnswer, config: Config) -> Result:
    reset = reset_action(name)
    latency = (("latency_s", answer.latency_s),)
    failed = {
        "exec-failed": ("control-client-missing", UNKNOWN, answer.detail, Advice("install the "
                        "CUDA MPS binaries or set commands.nvidia-cuda-mps-control in the "
                        "config"), ())
        if "not found" in answer.detail else  # as the daemon check tells a missing binary
        ("control-client-broken", CRITICAL, "the MPS control client is there but cannot run, "
         f"so no query can be made: {answer.detail}", Advice("reinstall the NVIDIA driver's "
         f"MPS binaries ({answer.detail}); a reset cannot help before that"), ()),
        "skipped": ("control-busy", UNKNOWN, answer.detail, Advice("another mps-health run is "
                    "querying this daemon; if this persists, look for a hung mps-health "
                    "process"), ()),
        "timeout": ("control-wedged", CRITICAL, f"the control daemon did not answer within "
                    f"{answer.latency_s:.1f}s (wedged: clients and queries hang)", reset, latency),
        "absent": ("control-absent", CRITICAL, "the client cannot find a control daemon for "
                   "this pipe dir", reset, latency),
    }.get(answer.status, ("control-error", CRITICAL, "the control daemon answered with an "
                          f"error: {answer.detail}", reset, latency))
    if answer.status != "ok":
        code, state, message, action, values = failed
        return Result(NAME, state, code, name, message, action.text, values,
                      commands=action.commands)
    percentage = float(answer.stdout.splitlines()[0])
    values = (("latency_s", answer.latency_s), ("thread_percentage", percentage))
    expected = config.control.expected_thread_percentage
    if expected is not None and abs(percentage - expected) > 0.05:
        return Result(NAME, WARNING, "control-percentage", name,
                      f"default active thread percentage is {percentage:g}, expected "
                      f"{expected:g}", f"run: echo set_default_active_thread_percentage "
                      f"{expected:g} | nvidia-cuda-mps-control (with this instance's pipe dir)",
                      values)
    if answer.latency_s > config.control.warn_latency_s:
        return Result(NAME, WARNING, "control-slow", name,
                      f"the control daemon took {answer.latency_s:.2f}s to answer "
                      f"(warning above {config.control.warn_latency_s:g}s)",
                      "look for a loaded or swapping node; check the daemon's control.log", values)
    return ok(NAME, name, f"answered in {answer.latency_s * 1000:.0f} ms "
              f"(default active thread percentage {percentage:g})",
              latency_s=answer.latency_s, thread_percentage=percentage)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    answers: Mapping[str, ControlAnswer] = facts.get("control")
    for inst in facts.instances:
        answer = answers.get(inst.name)
        yield judge(inst.name, answer, config) if answer is not None else Result(
            NAME, UNKNOWN, "control-not-asked", inst.name,
            "no control query was made for this instance", "")
