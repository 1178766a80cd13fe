"""canary: a real CUDA client through each instance is served by MPS, quickly.

The deepest check (it starts a CUDA context): on by default only where Slurm manages the
node, elsewhere with ``--only canary`` or ``checks.enable``; ``canary.when: idle`` (the
default) runs it only on an IDLE node with no MPS client, killed when a job step starts
(``probes.canary``). With no daemon or no MPS it is folded under that cause (FOLDS).
"""

from typing import Iterator, Mapping

from mps_health.checks.common import present, reset_action
from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import Advice, advice
from mps_health.model.facts import Facts
from mps_health.model.facts_deep import CanaryFact
from mps_health.model.results import CRITICAL, OK, UNKNOWN, Result

NAME = "canary"
CODES = ("canary-error", "canary-failed", "canary-no-libcuda", "canary-not-run",
         "canary-not-served", "canary-skipped", "canary-timeout")

registry.check(NAME, f"{__name__}:check", ("canary",), default_on=False,
               when_configured=("slurm",), order=90,
               summary="a real CUDA client through each instance is served by MPS")


def judge(name: str, c: CanaryFact) -> Result:
    values = present(("canary_served", 1.0 if c.status == "served" else 0.0),
                     ("canary_skipped", 1.0 if c.status == "skipped" else 0.0),
                     ("canary_latency_s", c.latency_s), ("canary_total_s", c.total_s))
    ms = f"{(c.latency_s or 0) * 1000:.0f} ms"
    reset = reset_action(name)
    code, state, message, action = {
        "served": ("ok", OK, f"a CUDA client (pid {c.pid}, uid {c.uid}) got a context in "
                   f"{ms}, {c.detail}", Advice("")),
        "skipped": ("canary-skipped", OK, f"canary not run: {c.detail}", Advice("")),
        "not-served": ("canary-not-served", CRITICAL, f"the canary (pid {c.pid}) got a CUDA "
                       f"context in {ms} but no MPS server listed it: CUDA clients of this "
                       "pipe dir silently run without MPS", reset),
        "failed": ("canary-failed", CRITICAL, f"the canary's {c.detail} through MPS", reset),
        "timeout": ("canary-timeout", CRITICAL, f"the canary got {c.detail}", reset),
        "not-run": ("canary-not-run", UNKNOWN, f"canary not run: {c.detail}",
                    Advice("if this persists, look for a hung mps-health process")),
        "no-libcuda": ("canary-no-libcuda", UNKNOWN, "libcuda.so.1 not found: no NVIDIA "
                       "driver here, so the canary cannot run", Advice("install the NVIDIA "
                       "driver, or turn the canary off on this node (checks.disable: [canary])")),
    }.get(c.status, ("canary-error", UNKNOWN, c.detail,
                     advice("run ", ("mps-health", "check", "--only", "canary", "-v"),
                            " as root")))
    return Result(NAME, state, code, name, message, action.text, values,
                  commands=action.commands)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    found: Mapping[str, CanaryFact] = facts.sources["canary"]  # type: ignore[assignment]
    for inst in facts.instances:
        fact = found.get(inst.name)
        yield judge(inst.name, fact) if fact is not None else Result(
            NAME, UNKNOWN, "canary-not-run", inst.name,
            "the canary did not finish within the run's budget",
            "raise budget_s or lower canary.timeout_s")
    if not facts.instances:
        yield Result(NAME, OK, "ok", "", "no MPS instance on this node")
