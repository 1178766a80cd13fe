"""A user with no job puts another user's Slurm job up for judging: run as uid mpshevil.

SLURM_JOB_ID is anyone's to set. An MPS client of the attacker that names the victim's
mps:30 job at 100 % of the threads, and one that names the victim's gpu job, used to make
``client-over-limit`` ("or end the job") and ``client-not-mps-job`` against the victim's
jobs. A client's job is now its Slurm cgroup; outside one, its SLURM_JOB_ID only where
squeue gives that job to the client's uid; anything else is ``client-job-mismatch``
against the attacker's uid, and the victim's jobs are not judged by those clients.
"""

import json
import os
import subprocess
from typing import Dict, Iterator, List

import pytest
from clirun import mps_health
from hostile import ATTACKER, VICTIM, as_user, ensure_user, squeue_line
from nodesite import Site


@pytest.fixture
def started() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def client_as(procs: List[subprocess.Popen], user: str, pipe: str, env: Dict[str, str]) -> int:
    """A stand-in client run as ``user`` with ``env`` (plus the instance's pipe dir)."""
    p = subprocess.Popen(["sleep", "120"], env={"PATH": os.environ["PATH"],
                                                "CUDA_MPS_PIPE_DIRECTORY": pipe, **env},
                         stdin=subprocess.DEVNULL, **as_user(user))
    procs.append(p)
    return p.pid


def test_a_claimed_job_of_another_user_is_the_claimants_warning(site: Site, started) -> None:
    evil = ensure_user(ATTACKER).pw_uid
    ensure_user(VICTIM)
    squeue = site.squeue(squeue_line("500", VICTIM, gres="gres:mps:30"),
                         squeue_line("501", VICTIM, gres="gres:gpu:1"))
    d = site.start_daemon(FAKE_MPS_PERCENTAGE="100.0")
    cfg = site.config(f"commands:\n  squeue: {squeue}\nclients: {{}}\n")
    pipe = str(d.pipe_dir)
    claims = [client_as(started, ATTACKER, pipe, {"SLURM_JOB_ID": "500",
                                                  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}),
              client_as(started, ATTACKER, pipe, {"SLURM_JOB_ID": "501"})]
    own = client_as(started, VICTIM, pipe, {"SLURM_JOB_ID": "500",
                                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    for pid in (*claims, own):
        d.query(f"fake_client_connect {pid} 0")

    r = mps_health("check", "--config", cfg, "--only", "clients", "--format", "json")
    assert r.returncode == 1 and r.stderr == "", r.stdout + r.stderr
    problems = json.loads(r.stdout)["problems"]
    assert [(p["code"], p["state"]) for p in problems] == [("client-job-mismatch", "WARNING")]
    message = problems[0]["message"]
    assert message.startswith(f"uid {evil} ({ATTACKER}): 2 MPS clients"), message
    assert all(str(pid) in message for pid in claims) and str(own) not in message
    # The victim's own client of the same job is judged, and within its share.
    assert not any(p["code"] in ("client-over-limit", "client-not-mps-job") for p in problems)

    view = mps_health("clients", "--config", cfg, "--format", "json")
    assert view.returncode == 0, view.stderr
    clients = {c["pid"]: c for c in
               json.loads(view.stdout)["instances"][0]["servers"][0]["clients"]}
    assert clients[own]["job_id"] == "500" and clients[own]["job_gres"] == "gres:mps:30"
    for pid in claims:
        assert clients[pid]["job_id"] is None and clients[pid]["job_gres"] is None
        assert clients[pid]["job_claimed"] in ("500", "501")
        assert f"of uid {ensure_user(VICTIM).pw_uid}" in clients[pid]["job_mismatch"]
    text = mps_health("clients", "--config", cfg).stdout
    row = next(ln for ln in text.splitlines() if ln.strip().startswith(str(claims[0])))
    assert "!500" in row and "not theirs" in row and "gres:mps:30" not in row


def test_an_own_job_in_the_environment_still_counts(site: Site, started) -> None:
    # No Slurm cgroup here (proctrack/linuxproc sites): the job user's own SLURM_JOB_ID,
    # confirmed by squeue, is their job, judged as before.
    evil = ensure_user(ATTACKER).pw_uid
    squeue = site.squeue(squeue_line("600", ATTACKER, uid=evil, gres="gres:mps:30"))
    d = site.start_daemon(FAKE_MPS_PERCENTAGE="100.0")
    cfg = site.config(f"commands:\n  squeue: {squeue}\nclients: {{}}\n")
    pid = client_as(started, ATTACKER, str(d.pipe_dir), {"SLURM_JOB_ID": "600"})
    d.query(f"fake_client_connect {pid} 0")
    r = mps_health("check", "--config", cfg, "--only", "clients", "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    problems = json.loads(r.stdout)["problems"]
    assert [p["code"] for p in problems] == ["client-over-limit"]
    assert f"client {pid} ({ATTACKER}, job 600)" in problems[0]["message"]
