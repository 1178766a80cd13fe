"""canary: a real CUDA client through each instance is served by MPS, quickly.

The deepest check (it starts a CUDA context): on by default only where Slurm manages
the node (a ``slurm:`` section, its ``registry.check`` below), elsewhere with ``--only canary``
or ``checks.enable``. ``canary.when`` (default ``idle``) lets it run only where Slurm
says the node is IDLE and no MPS client is connected, and kills it when a job step
starts meanwhile. With no daemon or no MPS, what it finds is folded under that cause
(``model/results.py`` FOLDS). See ``mps_health.probes.canary`` for how it runs and
when it skips.
"""

from typing import Iterator, Mapping

from mps_health.config.load import Config
from mps_health.model import registry
from mps_health.model.facts import Facts
from mps_health.model.facts_deep import CanaryFact
from mps_health.model.results import CRITICAL, OK, UNKNOWN, Result

NAME = "canary"
# Every code this check reports besides ok (each has a runbook entry in README.md).
CODES = ("canary-error", "canary-failed", "canary-no-libcuda", "canary-not-run",
         "canary-not-served", "canary-skipped", "canary-timeout")

# On where Slurm manages the node (a slurm: section): there canary.when: idle (the
# default) runs it only while Slurm says the node is IDLE and no MPS client is connected,
# and kills it when a job step arrives. Elsewhere only when asked (checks.enable, --only).
registry.check(NAME, f"{__name__}:check", ("canary",), default_on=False,
               when_configured=("slurm",), order=90,
               summary="a real CUDA client through each instance is served by MPS")


def _reset(name: str) -> str:
    return f"run 'mps-health remediate reset {name}' (dry run first: --dry-run)"


def judge(name: str, c: CanaryFact) -> Result:
    values = tuple((k, v) for k, v in (
        ("canary_served", 1.0 if c.status == "served" else 0.0),
        ("canary_skipped", 1.0 if c.status == "skipped" else 0.0),
        ("canary_latency_s", c.latency_s), ("canary_total_s", c.total_s)) if v is not None)
    if c.status == "served":
        return Result(NAME, OK, "ok", name,
                      f"a CUDA client (pid {c.pid}, uid {c.uid}) got a context in "
                      f"{(c.latency_s or 0) * 1000:.0f} ms, {c.detail}", "", values)
    if c.status == "skipped":
        return Result(NAME, OK, "canary-skipped", name, f"canary not run: {c.detail}", "",
                      values)
    if c.status == "not-served":
        return Result(NAME, CRITICAL, "canary-not-served", name,
                      f"the canary (pid {c.pid}) got a CUDA context in "
                      f"{(c.latency_s or 0) * 1000:.0f} ms but no MPS server listed it: "
                      "CUDA clients of this pipe dir silently run without MPS",
                      _reset(name), values)
    if c.status == "failed":
        return Result(NAME, CRITICAL, "canary-failed", name,
                      f"the canary's {c.detail} through MPS", _reset(name), values)
    if c.status == "timeout":
        return Result(NAME, CRITICAL, "canary-timeout", name, f"the canary got {c.detail}",
                      _reset(name), values)
    if c.status == "not-run":
        return Result(NAME, UNKNOWN, "canary-not-run", name, f"canary not run: {c.detail}",
                      "if this persists, look for a hung mps-health process", values)
    if c.status == "no-libcuda":
        return Result(NAME, UNKNOWN, "canary-no-libcuda", name,
                      "libcuda.so.1 not found: no NVIDIA driver here, so the canary cannot run",
                      "install the NVIDIA driver, or turn the canary off on this node "
                      "(checks.disable: [canary])",
                      values)
    return Result(NAME, UNKNOWN, "canary-error", name, c.detail,
                  "run 'mps-health check --only canary -v' as root", values)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    found: Mapping[str, CanaryFact] = facts.sources["canary"]  # type: ignore[assignment]
    for inst in facts.instances:
        fact = found.get(inst.name)
        if fact is None:
            yield Result(NAME, UNKNOWN, "canary-not-run", inst.name,
                         "the canary did not finish within the run's budget",
                         "raise budget_s or lower canary.timeout_s")
        else:
            yield judge(inst.name, fact)
    if not facts.instances:
        yield Result(NAME, OK, "ok", "", "no MPS instance on this node")
