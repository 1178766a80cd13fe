"""Where fact sources and checks are registered, switched on by name.

Fact sources are the lines at the end of this module. Each module of the ``checks``
package declares its check at import (``check(...)``), naming the sources it needs, so a
run gathers only those (no NVML, no Slurm call unless a check needs it). ``checks()``
imports every module of the package the first time the table is needed: adding a check
is its module, its test file and its runbook entry. A built-in passes its ``order`` (the
run's and every output's order; the table is kept sorted by it).

A site's own check is a module named in ``checks.modules``, imported at config load; it
declares itself the same way (its config sections in ``SECTIONS``) and, without an
``order``, runs after the built-ins. A check's target ("module:function") is imported when
it runs; a built-in's is relative to the package (``.checks.daemon:check``), which tells it
apart.
"""

from __future__ import annotations

import importlib
import os
import threading
from importlib.machinery import all_suffixes
from types import ModuleType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
)

from mps_health.model.facts import Instance
from mps_health.probes.context import Context

if TYPE_CHECKING:
    from mps_health.config.schema import Section


Instances = Tuple[Instance, ...]
# A probe's start: called before the other sources are read, it starts what the source
# waits on (daemon queries) and returns the function that collects it.
Start = Callable[[Context, Instances], Callable[[], object]]


class Probe(NamedTuple):
    """A fact source's probe, as its module gives it."""

    gather: Callable[[Context, Instances], object]  # the source's value
    value_type: Any  # the value's type (the probe's VALUE_TYPE), for a snapshot's replay
    start: Optional[Start] = None


class Source(NamedTuple):
    name: str
    # Imports the probe when a run needs it: most runs need few sources (no NVML, no Slurm
    # unless a check needs them), and a run imports only the probes it reads.
    probe: Callable[[], Probe]
    blocking: bool = False  # waits on other programs: gathered in a thread of its own


LAST = 1000  # where a check that gives no order runs: after every built-in


class CheckSpec(NamedTuple):
    name: str
    target: str  # "module:function", called as function(facts, config) -> results
    needs: Tuple[str, ...]
    default_on: bool = True
    summary: str = ""
    # Also on when the config has one of these sections (a node without NVML or Slurm
    # never pays for, nor fails, GPU/Slurm checks unless asked).
    when_configured: Tuple[str, ...] = ()
    order: int = LAST  # the run's and the outputs' order, lowest first


BUILTIN = ".checks"  # the package whose every module is a check (bar its helpers)
HELPERS = ("common",)  # modules of that package that declare no check

SOURCES: Dict[str, Source] = {}
# Read through checks(), which fills it with the built-ins first; kept sorted by order.
_CHECKS: Dict[str, CheckSpec] = {}
_found = False  # whether the built-in checks were imported
# A thread asking while another imports them waits for the whole table; reentrant: a
# module asking at import gets the table as it stands.
_finding = threading.RLock()


def source(name: str, probe: Callable[[], Probe], blocking: bool = False) -> None:
    SOURCES[name] = Source(name, probe, blocking)


def check(name: str, target: str, needs: Tuple[str, ...], default_on: bool = True,
          summary: str = "", when_configured: Tuple[str, ...] = (), order: int = LAST
          ) -> None:
    """Declare a check, at its module's import: ``target`` is ``f"{__name__}:check"``."""
    target = relative(target)
    old = _CHECKS.get(name)
    if old is not None and old.target != target:
        raise ValueError(f"check {name!r} is already declared by {old.target}")
    unknown = [n for n in needs if n not in SOURCES]
    if unknown:
        raise ValueError(f"check {name!r} needs unknown fact sources {unknown} "
                         f"(known: {', '.join(SOURCES)})")
    _CHECKS[name] = CheckSpec(name, target, needs, default_on, summary, when_configured,
                              order)
    ranked = sorted(_CHECKS.values(), key=lambda c: c.order)  # stable: ties as declared
    _CHECKS.clear()
    _CHECKS.update((c.name, c) for c in ranked)


def checks() -> Mapping[str, CheckSpec]:
    """Every check, in run order: the built-ins (each module of ``checks/``, imported
    the first time) and the site's declared so far (``checks.modules``, at config load)."""
    global _found
    with _finding:
        if not _found:
            _found = True  # first: a module that asks for the table at import finds it
            find_checks(BUILTIN)
    return _CHECKS


def find_checks(package: str) -> None:
    """Import every module of ``package``: each declares its check at import. One that
    cannot be imported stands in as a check named after its file, whose run reports why
    (UNKNOWN check-failed): a broken install never silently stops a check."""
    for name in module_files(module_named(package).__path__):
        if name in HELPERS:
            continue
        module = f"{package}.{name}"
        try:
            module_named(module)
        except Exception:  # judge imports it again and reports why, on its one line
            check(name.replace("_", "-"), f"{module}:check", (),
                  summary="its module cannot be imported ('mps-health check' says why)")


def module_files(path: Iterable[str]) -> List[str]:
    """The names of the modules (files, not sub-packages) in a package's dirs, sorted.
    A listing, not pkgutil.iter_modules: that one imports inspect (with ast, dis and
    tokenize) on every run for a name it could read off the file's suffix."""
    suffixes = tuple(all_suffixes())
    names = set()
    for directory in path:
        try:
            entries = os.listdir(directory)
        except OSError:  # as pkgutil: a dir that is gone holds no module
            continue
        for entry in entries:
            stem = next((entry[:-len(s)] for s in suffixes if entry.endswith(s)), "")
            if stem.isidentifier() and stem != "__init__":
                names.add(stem)
    return sorted(names)


def relative(target: str) -> str:
    """``target`` as the table keeps it: relative to the package when inside it."""
    return target[len("mps_health"):] if target.startswith("mps_health.") else target


# Config section -> as the site module declaring it gives it (config.load validates it).
SITE_SECTIONS: Dict[str, Section[Any]] = {}


def load_site_module(module: str) -> None:
    """Import a site check module named in ``checks.modules``; Invalid says what failed."""
    from mps_health.config.schema import Invalid, shown

    checks()  # the built-ins first: a site check may not take one's name
    try:
        mod = module_named(module)
    except Exception as e:  # a site's bug or a missing package: one line, exit 3
        first = (str(e).strip().splitlines() or [""])[0]
        raise Invalid(f"cannot import {shown(module)}: {type(e).__name__}: "
                      f"{shown(first)[1:-1]}", "modules") from None
    declared = relative(module)
    if not any(c.target.partition(":")[0] == declared for c in _CHECKS.values()):
        raise Invalid(f"{shown(module)} declares no check: call "
                      "mps_health.engine.registry.check(name, 'module:function', needs) at import",
                      "modules")
    for section in getattr(mod, "SECTIONS", ()):
        SITE_SECTIONS[section.name] = section


def module_named(name: str) -> ModuleType:
    """The module ``name`` (``.x.y`` is relative to the package), imported if it was not."""
    return importlib.import_module(name, "mps_health")


def load(target: str):  # -> the object named "module:attr"
    module, _, attr = target.partition(":")
    return getattr(module_named(module), attr)


# --- fact sources -----------------------------------------------------------------
# Each probe is imported by a function of its own, the first time a run reads its source.


def _processes() -> Probe:
    from mps_health.probes import proc
    return Probe(proc.gather_for, proc.VALUE_TYPE)


def _dirs() -> Probe:
    from mps_health.probes import dirs
    return Probe(dirs.gather, dirs.VALUE_TYPE)


def _control() -> Probe:
    from mps_health.probes import control
    return Probe(control.gather, control.VALUE_TYPE, control.start)


def _tmpfiles() -> Probe:
    from mps_health.probes import tmpfiles
    return Probe(tmpfiles.gather, tmpfiles.VALUE_TYPE)


def _servers() -> Probe:
    from mps_health.probes import servers
    return Probe(servers.gather, servers.VALUE_TYPE, servers.start)


def _blockers() -> Probe:
    from mps_health.probes import blockers
    return Probe(blockers.gather, blockers.VALUE_TYPE, blockers.start)


def _logs() -> Probe:
    from mps_health.probes import logs
    return Probe(logs.gather, logs.VALUE_TYPE)


def _canary() -> Probe:
    from mps_health.probes import canary
    return Probe(canary.gather, canary.VALUE_TYPE)


def _nvml() -> Probe:
    from mps_health.probes import nvml
    return Probe(nvml.gather, nvml.VALUE_TYPE)


def _slurm() -> Probe:
    from mps_health.probes import slurm
    return Probe(slurm.gather, slurm.VALUE_TYPE)


def _gres_conf() -> Probe:
    from mps_health.probes import gres_conf
    return Probe(gres_conf.gather, gres_conf.VALUE_TYPE)


def _jobs() -> Probe:
    from mps_health.probes import jobs
    return Probe(jobs.gather, jobs.VALUE_TYPE)


def _job_dirs() -> Probe:
    from mps_health.probes import jobdirs
    return Probe(jobdirs.gather, jobdirs.VALUE_TYPE)


def _job_records() -> Probe:
    from mps_health.probes import jobdirs
    return Probe(jobdirs.gather_records, jobdirs.RECORDS_TYPE)


source("processes", _processes)
source("dirs", _dirs)
source("control", _control)
source("tmpfiles", _tmpfiles)
source("servers", _servers)
# After control and servers (collected in this order): it looks only at the daemons they
# could not ask.
source("blockers", _blockers)
source("logs", _logs)
source("canary", _canary, blocking=True)
source("nvml", _nvml, blocking=True)
source("slurm", _slurm, blocking=True)
source("gres_conf", _gres_conf)
source("jobs", _jobs, blocking=True)
source("job_dirs", _job_dirs)
source("job_records", _job_records)
