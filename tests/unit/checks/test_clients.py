"""The clients check on made facts: each client judged against its Slurm job (not an mps
job, over its share, another user's job), a server's contexts near the MPS cap or over
several GPUs, and servers or jobs that could not be listed.

How a client's job is found (cgroup, environment) is tests/unit/test_client_jobs.py's."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
from mps_health.checks import clients
from mps_health.model.facts_deep import (
    ClientFact,
    DeviceFact,
    InstanceServers,
    ServerFact,
    ServersFacts,
)
from mps_health.model.results import OK, UNKNOWN, WARNING, Result
from mps_health.probes.jobs import JobsFacts
from mps_health.probes.slurm import SlurmJob

from .made import GPU0, NODE, NOW, codes, problems, run

VICTIM, EVIL = 1002, 1001
JOBS = (SlurmJob("500", "mpshvictim", VICTIM, "RUNNING", 600.0, "gres:mps:30"),
        SlurmJob("501", "mpshvictim", VICTIM, "RUNNING", 600.0, "gres:gpu:1"))


def client(pid: int, uid: int = VICTIM, job: str = "500", pct: Optional[float] = None,
           pipe_dir: Optional[str] = NODE.pipe_dir) -> ClientFact:
    user = {VICTIM: "mpshvictim", EVIL: "mpshevil"}[uid]
    return ClientFact(pid, uid, user, pid * 10, "./a.out", job, "cgroup" if job else "",
                      "read", pct, "", pipe_dir)


def server(*made: ClientFact, pct: Optional[float] = 30.0, devices: Tuple[DeviceFact, ...] = ()
           ) -> ServerFact:
    return ServerFact(4000, "ACTIVE", "", VICTIM, "mpshvictim", 40000, made, pct, devices)


def device(i: int, contexts: int = 1) -> DeviceFact:
    return DeviceFact(i, f"GPU-{i}", "NVIDIA H200", f"0000:0{i}:00.0", "", None, contexts)


def judge(*servers: ServerFact, jobs: Optional[JobsFacts] = None, query: str = "ok",
          cfg: Optional[Dict[str, Any]] = None) -> List[Result]:
    cur = InstanceServers(query, "no answer within 2.0s" if query == "timeout" else "", 100,
                          1000, servers, 0.01)
    sources = {"servers": ServersFacts(NOW, {"node": cur}, {}, ()),
               "jobs": jobs or JobsFacts("n1", JOBS)}
    return run(clients, sources, cfg=cfg)


def summary(results: List[Result]) -> Dict[str, float]:
    return dict(next(r for r in results if "clients" in dict(r.values)).values)


def test_a_client_within_its_jobs_share_is_ok() -> None:
    found = judge(server(client(2001, pct=30.0), devices=(device(0),)))
    assert problems(found) == []
    assert codes(found) == [("node", OK, "ok"), ("node", OK, "ok")]
    assert found[0].message == "1 clients of 1 jobs through 1 server"
    assert found[1].message == "server 4000 on GPU GPU-0: 1 client contexts, 30% threads, " \
        "no pinned memory limit"
    assert judge(query="idle")[0].message == "no server runs, so no client"


def test_a_client_of_a_job_that_asked_no_mps() -> None:
    (r,) = problems(judge(server(client(2001, job="501"))))
    assert (r.state, r.code) == (WARNING, "client-not-mps-job")
    assert r.message == "client 2001 (mpshvictim, job 501) is served by MPS server 4000 of " \
        "instance node, but job 501 asked for 'gres:gpu:1', not mps (through pipe dir " \
        "/tmp/nvidia-mps)"
    assert "keep non-MPS jobs off MPS" in r.action


def test_a_client_that_may_use_more_than_its_share() -> None:
    (r,) = problems(judge(server(client(2001), pct=100.0)))
    assert (r.state, r.code) == (WARNING, "client-over-limit")
    assert r.message == "client 2001 (mpshvictim, job 500) may use 100% of the GPU's threads " \
        "(its environment sets no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, its server 4000 allows " \
        "100), but job 500 asked for mps:30 (30%)"
    assert "scontrol show job 500" in r.action
    assert summary(judge(server(client(2001), pct=100.0)))["clients_over_limit"] == 1.0
    # Its own environment lowered it: within its share.
    assert problems(judge(server(client(2001, pct=30.0), pct=100.0))) == []


def test_a_client_naming_another_users_job_is_a_mismatch_against_its_owner() -> None:
    (r,) = problems(judge(server(client(2001, EVIL))))
    assert (r.state, r.code) == (WARNING, "client-job-mismatch")
    assert r.message.startswith("uid 1001 (mpshevil): 1 MPS client of instance node belongs "
                                "to no job of theirs (pid 2001;")
    assert "runs in the Slurm cgroup of job 500 of uid 1002" in r.message


@pytest.mark.parametrize("contexts, warned", [(44, True), (48, True), (43, False)])
def test_contexts_near_the_mps_cap(contexts: int, warned: bool) -> None:
    found = problems(judge(server(devices=(device(0, contexts),))))
    assert [(r.state, r.code) for r in found] == \
        ([(WARNING, "clients-near-cap")] if warned else [])
    if warned:
        assert found[0].message.startswith(f"server 4000 has {contexts} client contexts on "
                                           "GPU GPU-0: the MPS limit is 48 per GPU (warned "
                                           "from 44)")
        assert "spread the jobs" in found[0].action


def test_the_cap_warns_from_its_ratio() -> None:
    lower = {"clients": {"contexts_warn_ratio": 0.5}}
    assert [r.code for r in problems(judge(server(devices=(device(0, 24),)), cfg=lower))] == \
        ["clients-near-cap"]


def test_a_server_over_several_gpus_where_each_should_serve_one() -> None:
    two = server(devices=(device(0), device(1)))
    assert problems(judge(two)) == []  # node-wide layout: one server may span GPUs
    found = problems(judge(two, cfg={"clients": {"per_gpu_isolation": True}}))
    assert [(r.state, r.code) for r in found] == [(WARNING, "server-spans-gpus")]
    assert found[0].message.startswith("server 4000 of instance node uses 2 GPUs (GPU-0, "
                                       "GPU-1) where each instance should serve one GPU")
    assert "'mps-health remediate reset node'" in found[0].action


# The engine runs the check only with both its sources gathered.
NO_SERVER_LISTED = {"servers": ServersFacts(NOW, {}, {}, ()), "jobs": JobsFacts("n1", JOBS)}


def test_servers_that_could_not_be_listed() -> None:
    (r,) = judge(query="timeout")
    assert (r.state, r.code) == (UNKNOWN, "servers-not-asked")
    assert r.message == "cannot list the servers and their clients (timeout: no answer " \
        "within 2.0s)"
    found = run(clients, NO_SERVER_LISTED, (GPU0,))
    assert codes(found) == [("gpu0", UNKNOWN, "servers-not-asked")]
    assert found[0].message.endswith("(not asked)")


def test_jobs_that_could_not_be_listed() -> None:
    failed = JobsFacts("n1", None, "squeue: Unable to contact slurm controller")
    (r,) = problems(judge(server(client(2001), pct=100.0), jobs=failed))
    assert (r.state, r.code) == (UNKNOWN, "slurm-jobs-unavailable")
    assert r.message == "1 clients belong to Slurm jobs, but the job list could not be read " \
        "(squeue: Unable to contact slurm controller)"


def test_no_instance_is_ok() -> None:
    found = run(clients, NO_SERVER_LISTED, ())
    assert codes(found) == [("", OK, "ok")]
