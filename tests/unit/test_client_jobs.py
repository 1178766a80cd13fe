"""Which Slurm job an MPS client belongs to: its Slurm job cgroup first, its own
SLURM_JOB_ID only outside one and only when squeue gives that job to the client's uid;
anything else is client-job-mismatch against the process's owner, never charged to the
job it names (mps_health.probes.clientinfo, mps_health.checks.clients.attribute).

The cgroup lines are in the layouts Slurm 22.05 and 24.11 write (slurm.schedmd.com
cgroup_v2.html and cgroups.html; the paths are those of Slurm's cgroup/v1 and cgroup/v2
plugins: ``/slurm/uid_U/job_N/step_S``, ``/system.slice/slurmstepd.scope/job_N/step_S/
user/task_T``). This machine's own test cluster runs proctrack/linuxproc with no cgroup,
so these are not captured from it.
"""

from typing import List, Optional

from mps_health.checks.clients import MISMATCH_PIDS_SHOWN, attribute
from mps_health.config.load import from_mapping
from mps_health.model.facts import Facts, Instance
from mps_health.model.facts_deep import (
    ClientFact,
    DeviceFact,
    InstanceServers,
    ServerFact,
    ServersFacts,
)
from mps_health.model.results import WARNING
from mps_health.probes import clientinfo
from mps_health.probes.jobs import JobsFacts
from mps_health.probes.slurm import parse_squeue

# --- /proc/PID/cgroup as Slurm leaves it ---------------------------------------------------

# cgroup/v2 (22.05 and 24.11): one line; a task in step 0, the batch script, the extern
# step (pam_slurm_adopt puts ssh sessions there), an interactive step.
V2_TASK = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
V2_BATCH = "0::/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0\n"
V2_EXTERN = "0::/system.slice/slurmstepd.scope/job_4244/step_extern/user/task_special\n"
V2_INTERACTIVE = "0::/system.slice/slurmstepd.scope/job_4245/step_interactive/user/task_0\n"
# Several slurmd on one host: the scope is named after the node (NODENAME_slurmstepd.scope).
V2_NODE_SCOPE = "0::/system.slice/gpu-07_slurmstepd.scope/job_21868/step_1/user/task_3\n"
# cgroup/v1: one line per hierarchy; Slurm's plugins make /slurm/uid_U/job_N/step_S in
# the controllers they use, systemd's own hierarchy holds slurmd's unit.
V1_TASK = ("12:pids:/system.slice/slurmd.service\n"
           "11:devices:/slurm/uid_1002/job_77/step_0\n"
           "10:memory:/slurm/uid_1002/job_77/step_0/task_0\n"
           "9:freezer:/slurm/uid_1002/job_77/step_0\n"
           "5:cpuset:/slurm/uid_1002/job_77/step_0\n"
           "4:cpu,cpuacct:/\n"
           "1:name=systemd:/system.slice/slurmd.service\n")
V1_BATCH_NODE = ("9:freezer:/slurm_gpu-07/uid_1002/job_78/step_batch\n"
                 "5:cpuset:/slurm_gpu-07/uid_1002/job_78/step_batch\n")
# Outside Slurm: a login session, a service, a container, this machine's own.
NOT_SLURM = ("0::/user.slice/user-1001.slice/session-3.scope\n",
             "0::/system.slice/nvidia-mps.service\n",
             "0::/process_api/75d440ef7471afb4ffa1cdcf72022331\n",
             "9:name=systemd:/\n4:memory:/process_api/cb9682b41716d808157b7409e4c04847\n0::/\n")


def test_both_layouts_name_the_job() -> None:
    assert clientinfo.parse_cgroup(V2_TASK) == ("4242", True)
    assert clientinfo.parse_cgroup(V2_BATCH) == ("4243", True)
    assert clientinfo.parse_cgroup(V2_EXTERN) == ("4244", True)
    assert clientinfo.parse_cgroup(V2_INTERACTIVE) == ("4245", True)
    assert clientinfo.parse_cgroup(V2_NODE_SCOPE) == ("21868", True)
    assert clientinfo.parse_cgroup(V1_TASK) == ("77", True)
    assert clientinfo.parse_cgroup(V1_BATCH_NODE) == ("78", True)
    # The job cgroup itself (v1 lets a process sit there).
    assert clientinfo.parse_cgroup("9:freezer:/slurm/uid_0/job_5\n") == ("5", True)
    for text in NOT_SLURM:
        assert clientinfo.parse_cgroup(text) == ("", False), text


def test_names_only_where_root_makes_them_count() -> None:
    # systemd delegates a user's own subtree to them (user@UID.service): they may make
    # any name there and move their processes into it. Not a Slurm cgroup.
    for path in ("/user.slice/user-1001.slice/user@1001.service/app.slice/slurmstepd.scope/"
                 "job_4242/step_0/user/task_0",
                 "/user.slice/user-1001.slice/user@1001.service/slurm/uid_1002/job_77/step_0",
                 "/slurmstepd.scope/job_4242/step_0",  # not under system.slice
                 "/system.slice/evil.scope/job_4242/step_0",
                 "/system.slice/_slurmstepd.scope/job_4242/step_0",
                 "/system.slice/slurmstepd.scope/x/job_4242/step_0",
                 "/slurm/job_77/step_0",  # no uid level
                 "/slurmx/uid_1002/job_77/step_0",
                 "/slurm_/uid_1002/job_77/step_0",
                 "/slurm/uid_/job_77/step_0",
                 "/slurm/uid_01002/job_77/step_0"):
        assert clientinfo.job_of_cgroup_path(path) is None, path
        assert clientinfo.parse_cgroup(f"0::{path}\n") == ("", False), path


def test_job_numbers_are_strict() -> None:
    base = "0::/system.slice/slurmstepd.scope/"
    for bad in ("job_", "job_0", "job_0042", "job_42x", "job_-42", "job_+42", "job_4 2",
                "job_\u0664\u0662",  # Arabic-Indic digits: str.isdigit() says yes
                "job_\uff14\uff12",  # fullwidth digits
                "job_12345678901",  # more than a uint32 has
                "job_42/evil",  # below a job Slurm makes step_* only
                "job_42/../job_43/step_0", "JOB_42/step_0", "job_42 /step_0"):
        assert clientinfo.parse_cgroup(base + bad + "\n") == ("", False), bad
    assert clientinfo.parse_cgroup(base + "job_4294967294/step_0\n") == ("4294967294", True)


def test_lines_are_parsed_strictly() -> None:
    # A line without the three fields, or a hierarchy ID that is no number: skipped.
    assert clientinfo.parse_cgroup("/system.slice/slurmstepd.scope/job_1/step_0\n") == \
        ("", False)
    assert clientinfo.parse_cgroup("x::/system.slice/slurmstepd.scope/job_1/step_0\n") == \
        ("", False)
    # Two jobs named at once is no answer: no job, and the environment is not asked.
    two = "9:freezer:/slurm/uid_1002/job_77/step_0\n5:cpuset:/slurm/uid_1002/job_78/step_0\n"
    assert clientinfo.parse_cgroup(two) == ("", True)
    info = clientinfo.interpret({"SLURM_JOB_ID": "77"}, "read", b"", two)
    assert (info.job_id, info.job_from) == ("", "")
    # A read cut at the cap: its last (cut) line is dropped, never read as a shorter job.
    cut = "0::/system.slice/slurmstepd.scope/job_12"  # of job_123
    assert clientinfo.parse_cgroup(cut, truncated=True) == ("", False)
    assert clientinfo.parse_cgroup("9:freezer:/slurm/uid_1/job_5/step_0\n" + cut,
                                   truncated=True) == ("5", True)


def test_the_cgroup_read_is_bounded() -> None:
    assert clientinfo.CGROUP_CAP <= 64 * 1024
    huge = "".join(f"{i}:ctl{i}:/" + "a" * 200 + "\n" for i in range(1, 2000))
    assert clientinfo.parse_cgroup(huge + V2_TASK) == ("4242", True)  # parse cost is linear


# --- the environment: only outside a Slurm cgroup ------------------------------------------

def test_the_cgroup_comes_before_the_environment() -> None:
    env = {"SLURM_JOB_ID": "101", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    inside = clientinfo.interpret(env, "read", b"python3\0x.py\0", V2_TASK)
    assert (inside.job_id, inside.job_from, inside.thread_percentage) == \
        ("4242", "cgroup", 30.0)
    v1 = clientinfo.interpret(env, "read", b"", V1_TASK)
    assert (v1.job_id, v1.job_from) == ("77", "cgroup")
    for text in (*NOT_SLURM, ""):
        outside = clientinfo.interpret(env, "read", b"", text)
        assert (outside.job_id, outside.job_from) == ("101", "environ"), text


def test_a_job_id_in_the_environment_is_a_number_or_nothing() -> None:
    for bad in ("1;rm", "", " ", "0", "007", "1e3", "\u0664\u0662", "99999999999", "42\n",
                " 42 "):
        info = clientinfo.interpret({"SLURM_JOB_ID": bad}, "read", b"", "")
        assert (info.job_id, info.job_from) == ("", ""), bad
    assert clientinfo.interpret({"SLURM_JOB_ID": "42"}, "read", b"", "")[1:3] == \
        ("42", "environ")


# --- the check: whose job it is ----------------------------------------------------------

INST = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
UUID = "GPU-dc8b54e7-8cae-343e-f281-3701983156c6"
EVIL, VICTIM = 1001, 1002
JOBS = parse_squeue(f"500|mpshvictim|{VICTIM}|RUNNING|1:00:00|gres:mps:30\n"
                    f"501|mpshvictim|{VICTIM}|RUNNING|1:00:00|gres:gpu:1\n"
                    f"600|mpshevil|{EVIL}|RUNNING|1:00:00|gres:mps:50\n")
BY_ID = {j.job_id: j for j in JOBS}


def client(pid: int, uid: int, job: str, job_from: str = "environ",
           pct: Optional[float] = 100.0) -> ClientFact:
    user = {EVIL: "mpshevil", VICTIM: "mpshvictim"}.get(uid, "other")
    return ClientFact(pid, uid, user, pid * 10, "python3 x.py", job, job_from if job else "",
                      "read", pct, "", None)


def run_check(*clients: ClientFact, jobs: Optional[JobsFacts] = None) -> list:
    from mps_health.checks.clients import check

    dev = DeviceFact(0, UUID, "NVIDIA H200", "0000:00.06.00", "", None, len(clients))
    srv = ServerFact(569, "ACTIVE", "", VICTIM, "mpshvictim", 5690, tuple(clients), 60.0,
                     (dev,))
    facts = Facts("vm", 0.0, "/", (INST,), {
        "servers": ServersFacts(0.0, {INST.name: InstanceServers("ok", "", 1, 1, (srv,), 0.0)},
                                {}, ()),
        "jobs": jobs or JobsFacts("vm", JOBS)}, {}, {})
    return list(check(facts, from_mapping({}, None)))


def problems(results: list) -> List[tuple]:
    return [(r.code, r.state) for r in results if r.state]


def summary(results: list) -> dict:
    return dict(next(r for r in results if r.state == 0 and "clients" in dict(r.values)).values)


def test_attribute_is_by_the_jobs_owner() -> None:
    own = client(10, VICTIM, "500")
    assert attribute(own, BY_ID) == (BY_ID["500"], "")
    job, why = attribute(client(11, EVIL, "500"), BY_ID)
    assert job is None and why == "names in SLURM_JOB_ID job 500 of uid 1002"
    job, why = attribute(client(12, EVIL, "500", "cgroup"), BY_ID)
    assert job is None and why == "runs in the Slurm cgroup of job 500 of uid 1002"
    # A job squeue does not list here: no job, and nothing to hold against anyone.
    assert attribute(client(13, EVIL, "999"), BY_ID) == (None, "")
    assert attribute(client(14, EVIL, ""), BY_ID) == (None, "")


def test_a_claimed_job_of_another_user_is_not_charged_to_it() -> None:
    # The attacker (no job of their own) claims the victim's mps:30 job at 100 %, and
    # the victim's gpu job: before, each was charged to the victim's job.
    results = run_check(client(2001, EVIL, "500"), client(2002, EVIL, "501"))
    assert problems(results) == [("client-job-mismatch", WARNING)]
    found = results[0]
    assert found.message.startswith("uid 1001 (mpshevil): 2 MPS clients of instance node")
    assert "pid 2001, 2002" in found.message
    assert "client-over-limit" not in found.message and "500 asked" not in found.message
    assert all("job 500 asked" not in r.message and "job 501 asked" not in r.message
               for r in results)
    assert summary(results)["clients_job_mismatch"] == 2.0
    assert summary(results)["jobs"] == 0.0  # the victim's jobs have no client here


def test_a_cgroup_of_another_users_job_is_a_mismatch_too() -> None:
    results = run_check(client(2003, EVIL, "500", "cgroup"))
    assert problems(results) == [("client-job-mismatch", WARNING)]
    assert "runs in the Slurm cgroup of job 500 of uid 1002" in results[0].message
    assert "1 MPS client of instance node belongs to no job of theirs (pid 2003;" in \
        results[0].message


def test_the_owners_own_clients_are_judged_as_before() -> None:
    # The victim's own clients of the same jobs: over its limit, not an mps job.
    results = run_check(client(3001, VICTIM, "500", "cgroup"), client(3002, VICTIM, "501"),
                        client(3003, EVIL, "600", pct=50.0))
    assert problems(results) == [("client-over-limit", WARNING),
                                 ("client-not-mps-job", WARNING)]
    assert "client 3001 (mpshvictim, job 500)" in results[0].message
    assert summary(results)["jobs"] == 3.0 and summary(results)["clients_job_mismatch"] == 0.0


def test_one_line_per_uid_and_bounded() -> None:
    many = [client(4000 + i, EVIL, "500") for i in range(30)]
    other = client(5000, 1003, "600", "cgroup")
    results = run_check(*many, other)
    found = [r for r in results if r.code == "client-job-mismatch"]
    assert [r.message.split(" (")[0] for r in found] == ["uid 1001", "uid 1003"]
    first = found[0].message
    shown = ", ".join(str(4000 + i) for i in range(MISMATCH_PIDS_SHOWN))
    assert f"30 MPS clients of instance node belong to no job of theirs (pid {shown} and " \
        f"{30 - MISMATCH_PIDS_SHOWN} more;" in first
    assert str(4000 + MISMATCH_PIDS_SHOWN) not in first
    assert len(first) < 400
    assert "job 600 of uid 1001" in found[1].message
    assert summary(results)["clients_job_mismatch"] == 31.0


def test_a_hostile_user_name_is_escaped() -> None:
    evil = client(2001, EVIL, "500")._replace(user="x\n\x1b[31mOK")
    found = run_check(evil)[0]
    assert found.code == "client-job-mismatch"
    assert "\n" not in found.message and "\x1b" not in found.message


def test_without_the_job_list_nothing_is_charged() -> None:
    failed = JobsFacts("vm", None, "squeue: Unable to contact slurm controller")
    results = run_check(client(2001, EVIL, "500"), jobs=failed)
    assert problems(results) == [("slurm-jobs-unavailable", 3)]


def test_the_view_shows_a_claimed_job_as_not_theirs() -> None:
    from mps_health.cli.clients import render_text, view

    dev = DeviceFact(0, UUID, "NVIDIA H200", "0000:00.06.00", "", None, 2)
    srv = ServerFact(569, "ACTIVE", "", VICTIM, "mpshvictim", 5690,
                     (client(2001, EVIL, "500"), client(3001, VICTIM, "500", "cgroup")), 60.0,
                     (dev,))
    facts = Facts("vm", 0.0, "/", (INST,), {
        "servers": ServersFacts(0.0, {INST.name: InstanceServers("ok", "", 1, 1, (srv,), 0.0)},
                                {}, ()),
        "jobs": JobsFacts("vm", JOBS)}, {}, {})
    data = view(facts, from_mapping({}, None))
    evil, own = data["instances"][0]["servers"][0]["clients"]
    assert (evil["job_id"], evil["job_claimed"], evil["job_gres"]) == (None, "500", None)
    assert evil["job_mismatch"] == "names in SLURM_JOB_ID job 500 of uid 1002"
    assert (own["job_id"], own["job_claimed"], own["job_mismatch"], own["job_gres"]) == \
        ("500", None, None, "gres:mps:30")
    text = render_text(data)
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("2001"))
    assert "!500" in row and "not theirs" in row and "gres:mps:30" not in row


def test_a_reset_refusal_names_the_cgroup_job_and_a_claim_as_a_claim(tmp_path) -> None:
    """remediate reset asks no squeue: the job cgroup is named as the job, a SLURM_JOB_ID
    outside one as what the process says, through the probe's bounded read and parse."""
    from pathlib import Path

    from mps_health.remediation.clients import describe

    def fake_proc(pid: int, cgroup: str, job: str) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        for name in ("stat", "status"):  # a live process's, for its uid and start time
            (d / name).write_bytes(Path(f"/proc/self/{name}").read_bytes())
        (d / "cmdline").write_bytes(b"python3\0x.py\0")
        (d / "cgroup").write_text(cgroup)
        (d / "environ").write_bytes(f"SLURM_JOB_ID={job}\0".encode())

    fake_proc(101, V2_TASK, "500")  # in job 4242's cgroup, claiming 500: job 4242
    fake_proc(102, NOT_SLURM[0], "500")  # outside Slurm: only its word
    fake_proc(103, NOT_SLURM[0], "1;rm")
    assert describe(str(tmp_path), [101, 102, 103]) == "101 (job 4242), 102 (says job 500), 103"
