"""limits: the limits each running MPS server applies are the ones the operator set.

``set_default_active_thread_percentage`` and ``set_default_device_pinned_mem_limit`` only
shape the NEXT server the daemon starts: a default changed while a server runs is
silently not in force for its clients (``limits-not-in-force``, also for a per-job
server above its job's ``--gres=mps:N`` share; docs/gpu-validation.md).

control.log's ``Cmd:set_default_device_pinned_mem_limit DEV VALUE`` lines may set one
GPU's default both by UUID and by index (``pinned-limit-ambiguous``: the daemon keeps
both; on an H200 a new server applied the one set by index, though set first), or name
no GPU of the daemon (``pinned-limit-unknown-device``). A local user can make the daemon
log a command it then refuses, so both are WARNINGs (never a drain), judged only
against the device table of a daemon with a server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, Mapping, Optional, Tuple

from mps_health.checks.common import present, some, user_of
from mps_health.config.load import Config
from mps_health.config.slurm import settings as slurm_settings
from mps_health.engine import registry
from mps_health.model.facts import ControlAnswer, Facts, Instance
from mps_health.model.facts_deep import InstanceServers, LogsFacts, ServerFact, ServersFacts
from mps_health.model.printable import escape
from mps_health.model.results import WARNING, Result, ok

if TYPE_CHECKING:
    from mps_health.probes.jobs import JobsFacts

NAME = "limits"
CODES = ("limits-not-in-force", "pinned-limit-ambiguous", "pinned-limit-unknown-device")

registry.check(NAME, f"{__name__}:check", ("servers", "control", "logs"), order=70,
               summary="each running server applies the daemon's default limits; pinned limits "
                       "set on one ID per GPU")

SET_PINNED = "Cmd:set_default_device_pinned_mem_limit "
TOLERANCE = 0.05  # the daemon prints one decimal


def _limit(text: str) -> str:
    return escape(text) if text else "no limit"


def _who(server: ServerFact) -> str:
    return f"server {server.pid} ({user_of(server.user, server.uid, 'user unknown')})"


def default_percentage(answer: Optional[ControlAnswer]) -> Optional[float]:
    """The daemon's default active thread percentage from the run's control query."""
    if answer is None or answer.status != "ok":
        return None
    try:
        return float(answer.stdout.split()[0])
    except (ValueError, IndexError):
        return None


def job_share(inst: Instance, jobs: Optional[JobsFacts], mps_per_gpu: int
              ) -> Optional[Tuple[float, str]]:
    """A per-job instance's ``--gres=mps:N`` as a percentage, and how to say it."""
    if inst.job_id is None or jobs is None or not jobs.jobs or mps_per_gpu <= 0:
        return None
    from mps_health.probes.jobs import gres_count  # only for a per-job instance

    job = next((j for j in jobs.jobs if j.job_id == inst.job_id), None)
    asked = gres_count(job, "mps") if job is not None else None
    if job is None or asked is None:
        return None
    return (min(100.0, asked * 100.0 / mps_per_gpu),
            f"job {escape(job.job_id)}'s --gres=mps:{asked}")


def _restart(inst: Instance, server: ServerFact) -> str:
    return (f"it takes effect for the next server: let {_who(server)}'s clients end so that "
            "a new server starts with it, or set it on the running server "
            f"(set_active_thread_percentage / set_device_pinned_mem_limit {server.pid} ...) "
            f"through instance {inst.name}'s pipe dir; see the runbook")


def judge_threads(inst: Instance, server: ServerFact, default: Optional[float],
                  share: Optional[Tuple[float, str]]) -> Iterator[Result]:
    applied = server.thread_percentage
    if applied is None:
        return
    if default is not None and abs(applied - default) > TOLERANCE:
        than, shown = f"the default is {default:g}% (set after it started)", default
    elif share is not None and applied > share[0] + 0.5:
        than, shown = f"{share[1]} is {share[0]:g}%", None
    else:
        return
    yield Result(NAME, WARNING, "limits-not-in-force", inst.name,
                 f"{_who(server)} applies {applied:g}% active threads, {than}",
                 _restart(inst, server), present(("applied_thread_percentage", applied),
                                                 ("default_thread_percentage", shown)))


def judge_pinned(inst: Instance, server: ServerFact, defaults: Dict[str, str]
                 ) -> Iterator[Result]:
    for d in server.devices:
        if d.uuid in defaults and d.pinned_mem_limit != defaults[d.uuid]:
            yield Result(NAME, WARNING, "limits-not-in-force", inst.name,
                         f"{_who(server)} applies a pinned memory limit of "
                         f"{_limit(d.pinned_mem_limit)} on GPU {escape(d.uuid)}, the default "
                         f"is {_limit(defaults[d.uuid])} (set after it started)",
                         _restart(inst, server), (), (("UUID", d.uuid),))


def default_limits(cur: InstanceServers) -> Dict[str, str]:
    """The daemon's default pinned limit per GPU UUID ("" none), where both are known."""
    by_ordinal = dict(cur.default_pinned_mem_limits)
    return {uuid: by_ordinal[o] for o, uuid in cur.default_devices if o in by_ordinal}


def settings_in_log(inst: Instance, logs: LogsFacts) -> List[Tuple[str, str, float]]:
    """(device ID, value, time) of each default pinned limit set in the instance's
    control.log, oldest first."""
    out: List[Tuple[str, str, float]] = []
    for f in sorted((f for f in logs.findings
                     if f.log_dir == inst.log_dir and f.file == "control.log"), key=lambda f: f.at):
        if f.code == "log-daemon-start":
            out = []  # a new daemon starts with no default limit: the earlier ones are gone
        elif f.code == "log-pinned-limit-set" and f.text.startswith(SET_PINNED):
            words = f.text[len(SET_PINNED):].split()
            if len(words) == 2:
                out.append((words[0], words[1], f.at))
    return out


def judge_identifiers(inst: Instance, cur: InstanceServers,
                      settings: List[Tuple[str, str, float]]) -> Iterator[Result]:
    if not cur.default_devices or not settings:
        return  # no device table to judge the IDs by (asked only while a server runs)
    by_index = {str(o): o for o, _uuid in cur.default_devices}
    by_uuid = {uuid.lower(): o for o, uuid in cur.default_devices}
    seen: Dict[int, Dict[str, Tuple[str, str]]] = {}  # ordinal -> form -> (ID, value)
    unknown: List[str] = []
    for dev, value, _at in settings:
        ordinal = by_index[dev] if dev in by_index else by_uuid.get(dev.lower())
        if ordinal is None:
            unknown.append(f"{escape(dev)} {escape(value)}")
        else:
            seen.setdefault(ordinal, {})["index" if dev in by_index else "uuid"] = (dev, value)
    for ordinal in sorted(seen):
        forms = seen[ordinal]
        if "index" in forms and "uuid" in forms:
            (i, iv), (u, uv) = forms["index"], forms["uuid"]
            yield Result(NAME, WARNING, "pinned-limit-ambiguous", inst.name,
                         f"the default pinned memory limit of GPU {ordinal} was set both by "
                         f"index ({escape(i)} {escape(iv)}) and by UUID ({escape(u)} "
                         f"{escape(uv)}) in control.log: the daemon keeps both, and a new "
                         "server applies one of them (the one set by index, on the H200), "
                         "not the last set",
                         "set each GPU's default by one ID only (its UUID) with "
                         "set_default_device_pinned_mem_limit; see the runbook")
    if unknown:
        known = ", ".join(f"{o} / {escape(uuid)}" for o, uuid in cur.default_devices[:4])
        yield Result(NAME, WARNING, "pinned-limit-unknown-device", inst.name,
                     f"default pinned memory limits were set in control.log on IDs that name "
                     f"no GPU of the daemon ({some(unknown, 4)}): the daemon ignores them; its "
                     f"GPUs are {known}",
                     "set the limit again by the GPU's index or UUID "
                     "(set_default_device_pinned_mem_limit; device_query lists them); "
                     "see the runbook")


def _applied(servers: List[ServerFact], default: Optional[float]) -> Optional[float]:
    """The applied percentage shown for the instance: the one farthest from the default."""
    known = [s.thread_percentage for s in servers if s.thread_percentage is not None]
    if default is None:
        return known[0] if known else None
    return max(known, key=lambda p: abs(p - default), default=None)


def judge_instance(inst: Instance, cur: InstanceServers, default: Optional[float],
                   share: Optional[Tuple[float, str]],
                   settings: List[Tuple[str, str, float]]) -> Iterator[Result]:
    live = [s for s in cur.servers if s.status not in ("gone", "error")]
    defaults = default_limits(cur)
    problems: List[Result] = []
    for server in live:
        problems += judge_threads(inst, server, default, share)
        problems += judge_pinned(inst, server, defaults)
    problems += judge_identifiers(inst, cur, settings)
    yield from problems
    values = present(("limits_not_in_force", sum(r.code == "limits-not-in-force"
                                                 for r in problems)),
                     ("default_thread_percentage", default),
                     ("applied_thread_percentage", _applied(live, default)))
    text = (f"{len(live)} server{'s' if len(live) != 1 else ''} apply the daemon's defaults"
            if live else "no server runs")
    yield Result(NAME, 0, "ok", inst.name, text, "", values)
    yield from gpu_values(inst, live, defaults)


def gpu_values(inst: Instance, live: List[ServerFact], defaults: Dict[str, str]
               ) -> Iterator[Result]:
    """Per GPU (label UUID): the default pinned limit and the applied one (the server's
    that differs from the default, else the default's), in bytes; none set: no sample."""
    if not live and not defaults:
        return
    from mps_health.probes.clientinfo import mem_bytes  # only where a server runs

    applied: Dict[str, str] = {}
    for server in live:
        for d in server.devices:
            if d.uuid not in applied or d.pinned_mem_limit != defaults.get(d.uuid):
                applied[d.uuid] = d.pinned_mem_limit
    for uuid in sorted(set(applied) | set(defaults)):
        want, now = defaults.get(uuid), applied.get(uuid)
        values = present(("default_pinned_mem_limit_bytes", mem_bytes(want) if want else None),
                         ("applied_pinned_mem_limit_bytes", mem_bytes(now) if now else None))
        if values:
            yield Result(NAME, 0, "ok", inst.name,
                         f"GPU {escape(uuid)}: default pinned memory {_limit(want or '')}, "
                         f"applied {_limit(now or '')}", "", values, (("UUID", uuid),))


def check(facts: Facts, config: Config) -> Iterator[Result]:
    sf: ServersFacts = facts.sources["servers"]  # type: ignore[assignment]
    control: Mapping[str, ControlAnswer] = facts.get("control")
    logs: LogsFacts = facts.get("logs")
    jobs: Optional[JobsFacts] = facts.sources.get("jobs")  # type: ignore[assignment]
    mps_per_gpu = slurm_settings(config).mps_per_gpu
    for inst in facts.instances:
        cur = sf.instances.get(inst.name)
        if cur is None or cur.query not in ("ok", "idle"):
            # The servers check says why (servers-not-asked): not a second time here.
            yield ok(NAME, inst.name, "the servers were not asked: see the servers check")
            continue
        answer = control.get(inst.name)
        yield from judge_instance(inst, cur, default_percentage(answer),
                                  job_share(inst, jobs, mps_per_gpu), settings_in_log(inst, logs))
    if not facts.instances:
        yield ok(NAME, "", "no MPS instance on this node")
