"""Where fact sources and checks are registered: one line each, switched on by name.

A check names the fact sources it needs, so a run gathers only those: no NVML unless
a GPU check runs, no Slurm call unless a Slurm check runs. Targets are imported lazily
("module:function").

A site's own check is a module named in the config (``checks.modules``); loading the
config imports it, and it declares itself as the built-ins below do, with a
``check(...)`` call at import (and its config sections in a ``SECTIONS`` tuple).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict, NamedTuple, Tuple


class Source(NamedTuple):
    name: str
    target: str  # "module:function", called as function(ctx, instances)
    value_type: str  # "module:NAME" of the value's type, for snapshot replay
    blocking: bool = False  # waits on other programs: gathered in a thread of its own
    # Or "module:function", called as function(ctx, instances) before the other sources
    # are read: it starts the commands (and threads) the source waits on and returns the
    # function that collects them, called after them. No thread of the engine's then.
    start: str = ""


class CheckSpec(NamedTuple):
    name: str
    target: str  # "module:function", called as function(facts, config) -> results
    needs: Tuple[str, ...]
    default_on: bool = True
    summary: str = ""
    # Also on by default when the config has one of these sections (GPU/Slurm checks:
    # a node without NVML or Slurm never pays for them, nor fails them, unless asked).
    when_configured: Tuple[str, ...] = ()


SOURCES: Dict[str, Source] = {}
CHECKS: Dict[str, CheckSpec] = {}


def source(name: str, target: str, value_type: str, blocking: bool = False,
           start: str = "") -> None:
    SOURCES[name] = Source(name, target, value_type, blocking, start)


def check(name: str, target: str, needs: Tuple[str, ...], default_on: bool = True,
          summary: str = "", when_configured: Tuple[str, ...] = ()) -> None:
    old = CHECKS.get(name)
    if old is not None and old.target != target:
        raise ValueError(f"check {name!r} is already declared by {old.target}")
    unknown = [n for n in needs if n not in SOURCES]
    if unknown:
        raise ValueError(f"check {name!r} needs unknown fact sources {unknown} "
                         f"(known: {', '.join(SOURCES)})")
    CHECKS[name] = CheckSpec(name, target, needs, default_on, summary, when_configured)


SITE_SECTIONS: Dict[str, str] = {}  # config section -> the site module declaring it


def load_site_module(module: str) -> None:
    """Import a site check module named in ``checks.modules``; Invalid says what failed."""
    from mps_health.config.schema import Invalid, shown

    try:
        mod = module_named(module)
    except Exception as e:  # a site's bug or a missing package: one line, exit 3
        first = (str(e).strip().splitlines() or [""])[0]
        raise Invalid(f"cannot import {shown(module)}: {type(e).__name__}: "
                      f"{shown(first)[1:-1]}", "modules") from None
    if not any(c.target.partition(":")[0] == module for c in CHECKS.values()):
        raise Invalid(f"{shown(module)} declares no check: call "
                      "mps_health.model.registry.check(name, 'module:function', needs) at import",
                      "modules")
    for section in getattr(mod, "SECTIONS", ()):
        SITE_SECTIONS[section.name] = module


def module_named(name: str) -> ModuleType:
    """The module ``name`` (``.x.y`` is relative to the package), imported if it was not."""
    return importlib.import_module(name, "mps_health")


def load(target: str):  # -> the object named "module:attr"
    module, _, attr = target.partition(":")
    return getattr(module_named(module), attr)


# --- fact sources -----------------------------------------------------------------
source("processes", ".probes.proc:gather_for", ".probes.proc:VALUE_TYPE")
source("dirs", ".probes.dirs:gather", ".probes.dirs:VALUE_TYPE")
source("control", ".probes.control:gather", ".probes.control:VALUE_TYPE",
       start=".probes.control:start")
source("tmpfiles", ".probes.tmpfiles:gather_for",
       ".probes.tmpfiles:VALUE_TYPE")
source("servers", ".probes.servers:gather", ".probes.servers:VALUE_TYPE",
       start=".probes.servers:start")
source("logs", ".probes.logs:gather", ".probes.logs:VALUE_TYPE")
source("canary", ".probes.canary:gather", ".probes.canary:VALUE_TYPE",
       blocking=True)
source("nvml", ".probes.nvml:gather", ".probes.nvml:VALUE_TYPE", blocking=True)
source("slurm", ".probes.slurm:gather", ".probes.slurm:VALUE_TYPE",
       blocking=True)
source("gres_conf", ".probes.gres_conf:gather", ".probes.gres_conf:VALUE_TYPE")
source("jobs", ".probes.jobs:gather", ".probes.jobs:VALUE_TYPE", blocking=True)
source("job_dirs", ".probes.jobdirs:gather", ".probes.jobdirs:VALUE_TYPE")
source("job_records", ".probes.jobdirs:gather_records",
       ".probes.jobdirs:RECORDS_TYPE")

# --- checks -------------------------------------------------------------------------
check("daemon", ".checks.daemon:check", ("processes", "dirs"),
      summary="a live control daemon serves each instance")
check("strays", ".checks.strays:check", ("processes", "servers"),
      summary="no MPS server or daemon outside the configured instances")
check("control", ".checks.control:check", ("control",),
      summary="the control daemon answers in time")
check("directories", ".checks.directories:check", ("dirs",),
      summary="pipe and log dirs are real dirs with the right mode and owner")
check("tmpfiles", ".checks.tmpfiles:check", ("tmpfiles",),
      summary="systemd-tmpfiles will not clean the pipe dirs")
check("servers", ".checks.servers:check", ("servers",),
      summary="no MPS server in FAULT or stuck INITIALIZING; no restart or churn lately")
check("limits", ".checks.limits:check", ("servers", "control", "logs"),
      summary="each running server applies the daemon's default limits; pinned limits "
              "set on one ID per GPU")
check("logs", ".checks.logs:check", ("logs",),
      summary="no pending clients, failed servers or refused connections in the MPS logs")
# On where Slurm manages the node (a slurm: section): there canary.when: idle (the
# default) runs it only while Slurm says the node is IDLE and no MPS client is connected,
# and kills it when a job step arrives. Elsewhere only when asked (checks.enable, --only).
check("canary", ".checks.canary:check", ("canary",), default_on=False,
      when_configured=("slurm",),
      summary="a real CUDA client through each instance is served by MPS")
check("compute-mode", ".checks.compute_mode:check", ("nvml",), default_on=False,
      when_configured=("gpu",),
      summary="each GPU's compute mode is the expected one; no MIG under MPS")
check("gres-drift", ".checks.gres_drift:check",
      ("slurm", "nvml", "gres_conf", "processes", "dirs"), default_on=False,
      when_configured=("slurm",),
      summary="Slurm's GPUs and mps agree with NVML, gres.conf and the daemons")
check("orphans", ".checks.orphans:check",
      ("slurm", "job_dirs", "job_records", "processes", "servers"),
      default_on=False, when_configured=("slurm", "orphans"),
      summary="no per-job MPS dirs or daemons outlive their job")
check("clients", ".checks.clients:check", ("servers", "jobs"), default_on=False,
      when_configured=("clients", "slurm"),
      summary="MPS clients match their jobs: mps asked, thread limit, context cap, one GPU")
