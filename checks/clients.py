"""clients: who MPS serves, judged against what their Slurm jobs asked for (facts: the
servers probe, each client's job id and CUDA_MPS_* environment from /proc, one squeue).

A CUDA client reaches the default pipe dir unless told otherwise, so a node-wide daemon
captures jobs that asked for no mps (``client-not-mps-job``). A client's thread ceiling
is the lower of its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at exec and its server's: a
client can only lower it (``client-over-limit``; docs/clients.md, as for the 48 contexts
per GPU of ``clients-near-cap``). A job counts only when squeue gives it to the client's
uid (``attribute``); else ``client-job-mismatch``, one line per process owner.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from mps_health.checks.common import present, some, user_of
from mps_health.config.deep_checks import CLIENTS as SECTION
from mps_health.config.deep_checks import ClientsConfig
from mps_health.config.load import Config
from mps_health.config.slurm import settings as slurm_settings
from mps_health.engine import registry
from mps_health.engine.actionhints import RESET, advice
from mps_health.model.facts import Facts, Instance
from mps_health.model.facts_deep import ClientFact, InstanceServers, ServerFact, ServersFacts
from mps_health.model.printable import escape
from mps_health.model.results import UNKNOWN, WARNING, Result, ok
from mps_health.probes.proc import DEFAULT_PIPE_DIR

if TYPE_CHECKING:  # fact types only: few runs run the check
    from mps_health.model.slurm_facts import SlurmJob
    from mps_health.probes.jobs import JobsFacts

NAME = "clients"
CODES = ("client-job-mismatch", "client-not-mps-job", "client-over-limit", "clients-near-cap",
         "server-spans-gpus", "servers-not-asked", "slurm-jobs-unavailable")

registry.check(NAME, f"{__name__}:check", ("servers", "jobs"), default_on=False,
               when_configured=("clients", "slurm"), order=130,
               summary="MPS clients match their jobs: mps asked, thread limit, context cap, "
                       "one GPU")

MISMATCH_PIDS_SHOWN = 8  # PIDs named in one client-job-mismatch line; the rest counted


def who(c: ClientFact) -> str:
    job = f", job {escape(c.job_id)}" if c.job_id else ""
    return f"client {c.pid} ({user_of(c.user, c.uid, 'gone')}{job})"


def attribute(c: ClientFact, by_id: Dict[str, SlurmJob]) -> Tuple[Optional[SlurmJob], str]:
    """The Slurm job a client belongs to, and why the job it names is not its own ("" when
    it is, or names none squeue lists): the one rule for the check and the view. A job
    counts only when squeue gives it to the client's uid: SLURM_JOB_ID is anyone's to set,
    so a user could otherwise put another user's job up for judging, or hide behind it."""
    if not c.job_id:
        return None, ""
    job = by_id.get(c.job_id)
    if job is None:
        return None, ""  # ended, started after squeue, or never here: nothing to say
    if c.uid is not None and job.uid == c.uid:
        return job, ""
    how = ("runs in the Slurm cgroup of" if c.job_from == "cgroup"
           else "names in SLURM_JOB_ID")
    return None, f"{how} job {escape(job.job_id)} of uid {job.uid}"


def mismatches(inst: Instance, wrong: Dict[int, List[Tuple[ClientFact, str]]]
               ) -> Iterator[Result]:
    """One client-job-mismatch per uid whose clients name other users' jobs."""
    for uid in sorted(wrong):
        found = wrong[uid]
        user = escape(found[0][0].user) if found[0][0].user else "?"
        pids = some([str(c.pid) for c, _why in found], MISMATCH_PIDS_SHOWN)
        many = len(found) != 1
        yield Result(NAME, WARNING, "client-job-mismatch", inst.name,
                     f"uid {uid} ({user}): {len(found)} MPS client{'s' if many else ''} of "
                     f"instance {inst.name} belong{'' if many else 's'} to no job of theirs "
                     f"(pid {pids}; pid {found[0][0].pid} {found[0][1]}): not charged "
                     "to that job",
                     f"ask uid {uid} why their processes claim another user's job "
                     f"(ps -o pid,user,args -p {found[0][0].pid}; cat /proc/"
                     f"{found[0][0].pid}/cgroup); see the runbook")


def ceiling(c: ClientFact, server: ServerFact) -> Tuple[float, str]:
    """The most of the GPU's threads a client may use, and why (pure)."""
    env = c.thread_percentage if c.thread_percentage is not None else 100.0
    cap = server.thread_percentage if server.thread_percentage is not None else 100.0
    said = (f"its environment says {c.thread_percentage:g}" if c.thread_percentage is not None
            else "its environment sets no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    limit = (f"its server {server.pid} allows {cap:g}" if server.thread_percentage is not None
             else f"its server {server.pid} did not say its limit")
    return min(env, cap), f"{said}, {limit}"


def judge_client(inst: Instance, server: ServerFact, c: ClientFact, job: SlurmJob,
                 mps_per_gpu: int) -> Iterator[Result]:
    from mps_health.probes.jobs import gres_count  # only where the check runs

    asked = gres_count(job, "mps")
    if asked is None:
        unset = c.pipe_dir is None and c.environ in ("read", "truncated")
        how = ("its CUDA_MPS_PIPE_DIRECTORY is unset, so the default pipe dir took it"
               if unset and inst.pipe_dir == DEFAULT_PIPE_DIR else
               f"through pipe dir {escape(c.pipe_dir or inst.pipe_dir)}")
        yield Result(NAME, WARNING, "client-not-mps-job", inst.name,
                     f"{who(c)} is served by MPS server {server.pid} of instance "
                     f"{inst.name}, but job {escape(job.job_id)} asked for "
                     f"'{escape(job.gres) or 'no gres'}', not mps ({how})",
                     "keep non-MPS jobs off MPS: give their tasks a "
                     "CUDA_MPS_PIPE_DIRECTORY without a daemon (TaskProlog), or run MPS "
                     "only on the GPUs Slurm offers as mps (per-gpu layout); see the runbook")
        return
    if c.environ not in ("read", "truncated"):
        return  # its environment is unknown: it may have lowered its own limit
    share = asked * 100.0 / mps_per_gpu
    most, why = ceiling(c, server)
    if most > share + 0.5:
        yield Result(NAME, WARNING, "client-over-limit", inst.name,
                     f"{who(c)} may use {most:g}% of the GPU's threads ({why}), but job "
                     f"{escape(job.job_id)} asked for mps:{asked} ({share:g}%)",
                     "find out why the job changed CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
                     f"(scontrol show job {escape(job.job_id)}); lower the server's default "
                     "with set_default_active_thread_percentage, or end the job")


def judge_server(inst: Instance, server: ServerFact, cfg: ClientsConfig,
                 isolation: bool) -> Iterator[Result]:
    warn_at = max(1, math.ceil(cfg.max_contexts_per_device * cfg.contexts_warn_ratio))
    devices = server.devices or ()
    counts = [(d.uuid, d.contexts) for d in devices if d.contexts is not None]
    if not counts and not devices:
        counts = [("", len(server.clients))]
    for uuid, n in counts:
        if n >= warn_at:
            on = f" on GPU {escape(uuid)}" if uuid else ""
            yield Result(NAME, WARNING, "clients-near-cap", inst.name,
                         f"server {server.pid} has {n} client contexts{on}: the MPS limit is "
                         f"{cfg.max_contexts_per_device} per GPU (warned from {warn_at}); "
                         "new clients then fail (cudaErrorMpsMaxClientsReached, 808)",
                         "spread the jobs over more GPUs or nodes; lower the jobs' processes "
                         "per GPU (each process takes at least one context)")
    if isolation and len(devices) > 1:
        shown = ", ".join(escape(d.uuid) for d in devices[:4])
        restart = advice("start the instance's daemon with CUDA_VISIBLE_DEVICES set to its "
                         "GPU (the nvidia-mps@ unit does), then ", (*RESET, inst.name),
                         " (dry run first)")
        yield Result(NAME, WARNING, "server-spans-gpus", inst.name,
                     f"server {server.pid} of instance {inst.name} uses {len(devices)} GPUs "
                     f"({shown}) where each instance should serve one GPU: its daemon was "
                     "started without CUDA_VISIBLE_DEVICES naming its GPU",
                     restart.text, commands=restart.commands)


def device_results(inst: Instance, server: ServerFact, cfg: ClientsConfig
                   ) -> Iterator[Result]:
    """One OK result per GPU a server uses: its numbers, labelled by the GPU's UUID."""
    for d in server.devices:
        values = present(("contexts_limit", cfg.max_contexts_per_device), ("contexts", d.contexts),
                         ("server_thread_percentage", server.thread_percentage),
                         ("server_pinned_mem_limit_bytes", d.pinned_mem_limit_bytes))
        limit = d.pinned_mem_limit or "no pinned memory limit"
        pct = (f"{server.thread_percentage:g}% threads" if server.thread_percentage is not None
               else "threads unknown")
        yield Result(NAME, 0, "ok", inst.name,
                     f"server {server.pid} on GPU {escape(d.uuid)}: {d.contexts} client "
                     f"contexts, {pct}, {escape(limit)}", "", values, (("UUID", d.uuid),))


def judge_instance(inst: Instance, cur: InstanceServers, jobs: JobsFacts,
                   cfg: ClientsConfig, mps_per_gpu: int, isolation: bool) -> Iterator[Result]:
    live = [s for s in cur.servers if s.status not in ("gone", "error")]
    clients = [(s, c) for s in live for c in s.clients if c.uid is not None]
    by_id: Dict[str, SlurmJob] = {j.job_id: j for j in jobs.jobs or ()}
    problems = [r for server in live for r in judge_server(inst, server, cfg, isolation)]
    with_job = [(s, c) for s, c in clients if c.job_id]
    # Until squeue says whose each job is, the jobs are those the clients name.
    job_ids = {c.job_id for _s, c in with_job}
    wrong: Dict[int, List[Tuple[ClientFact, str]]] = {}
    if not jobs.asked:
        pass  # a server started after the jobs source looked: judged next run
    elif with_job and jobs.jobs is None:
        problems.append(Result(NAME, UNKNOWN, "slurm-jobs-unavailable", inst.name,
                               f"{len(with_job)} clients belong to Slurm jobs, but the job "
                               f"list could not be read ({jobs.error})",
                               "scontrol ping; squeue -w NODE by hand"))
    else:
        job_ids = set()
        for server, c in with_job:
            job, why = attribute(c, by_id)
            if why and c.uid is not None:
                wrong.setdefault(c.uid, []).append((c, why))
            elif job is not None:
                job_ids.add(job.job_id)
                problems += judge_client(inst, server, c, job, mps_per_gpu)
        problems += mismatches(inst, wrong)
    yield from problems
    codes = [r.code for r in problems]
    values = present(("clients", len(clients)),
                     ("clients_not_mps_job", codes.count("client-not-mps-job")),
                     ("clients_over_limit", codes.count("client-over-limit")),
                     ("jobs", len(job_ids)),
                     ("clients_job_mismatch", sum(map(len, wrong.values()))))
    if cur.query == "idle":
        text = "no server runs, so no client"
    elif not clients:
        text = "no client connected"
    else:
        unread = sum(c.environ not in ("read", "truncated") for _s, c in clients)
        text = (f"{len(clients)} clients of {len(job_ids)} jobs through "
                f"{len(live)} server{'s' if len(live) != 1 else ''}"
                + (f"; {unread} environments unreadable (run as root)" if unread else ""))
    yield Result(NAME, 0, "ok", inst.name, text, "", values)
    for server in live:
        yield from device_results(inst, server, cfg)


def check(facts: Facts, config: Config) -> Iterator[Result]:
    cfg: ClientsConfig = config.get(SECTION)
    mps_per_gpu = slurm_settings(config).mps_per_gpu
    isolation = cfg.per_gpu_isolation if cfg.per_gpu_isolation is not None \
        else config.mps.layout == "per-gpu"
    sf: ServersFacts = facts.sources["servers"]  # type: ignore[assignment]
    jobs: JobsFacts = facts.get("jobs")
    for inst in facts.instances:
        cur = sf.instances.get(inst.name)
        if cur is None or cur.query not in ("ok", "idle"):
            why = f"{cur.query}: {cur.detail}" if cur is not None else "not asked"
            yield Result(NAME, UNKNOWN, "servers-not-asked", inst.name,
                         f"cannot list the servers and their clients ({why})",
                         "see the daemon and control checks")
            continue
        yield from judge_instance(inst, cur, jobs, cfg, mps_per_gpu, isolation)
    if not facts.instances:
        yield ok(NAME, "", "no MPS instance on this node")
