"""clients: the real daemon's answers parsed, clients judged against their jobs, the view.

Parsers run on answers captured on the H200 (tests/fixtures/nvidia-cuda-mps-control_*
__h200-cuda13.0_*); the fake daemon is held to the same formats; the checks are pure
functions of facts; the command and the check run end to end on the fake daemon with
real client processes and a squeue stand-in printing squeue's own format.
"""

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from clirun import mps_health
from conftest import FIXTURES, fixture_text
from mps_health.config.load import from_mapping
from mps_health.model.facts import Facts, Instance
from mps_health.model.facts_deep import (
    ClientFact,
    DeviceFact,
    InstanceServers,
    ServerFact,
    ServersFacts,
)
from mps_health.model.results import UNKNOWN, WARNING
from mps_health.probes import clientinfo
from mps_health.probes.jobs import JobsFacts, gres_count
from mps_health.probes.slurm import SlurmJob, parse_squeue

UUID = "GPU-05803005-9e7a-c129-2f1f-b83ee0421857"
CTL = "nvidia-cuda-mps-control_{}__h200-cuda13.0_{}.txt"


def real(command: str, case: str) -> str:
    return fixture_text(CTL.format(command, case))


# --- the real daemon's answers ----------------------------------------------------------

def test_ps_of_four_clients() -> None:
    rows = clientinfo.parse_ps(real("ps", "four-clients"))
    assert [r.pid for r in rows] == [504, 505, 503, 506]
    assert {r.server for r in rows} == {569}
    assert rows[0].device == "GPU-05803005-9e7a-c129"  # the daemon cuts the UUID
    assert rows[0].namespace == "4026531836"
    assert rows[0].command == "/opt/torch/.venv/bin/python3"
    assert clientinfo.parse_ps(real("ps", "idle")) == ()


def test_device_query_sections() -> None:
    idle = clientinfo.parse_device_query(real("device_query", "idle"))
    assert list(idle) == ["default"]
    busy = clientinfo.parse_device_query(real("device_query", "one-server"))
    assert busy["569"] == (clientinfo.DeviceRow(0, "0000:00.06.00", UUID, "NVIDIA H200"),)
    assert busy["default"] == busy["569"]


def test_limits_and_contexts() -> None:
    assert clientinfo.parse_percentage(real("get_active_thread_percentage", "60")) == 60.0
    with pytest.raises(clientinfo.ParseError):
        clientinfo.parse_percentage(real("get_active_thread_percentage", "unknown-pid"))
    assert clientinfo.parse_mem_limit(real("get_device_pinned_mem_limit", "4G")) == \
        ("4G", 4 * 2**30)
    assert clientinfo.parse_mem_limit(real("get_default_device_pinned_mem_limit", "unset")) == \
        ("", None)
    # set ... 1500M is stored as whole GiB: compare what the daemon keeps.
    assert clientinfo.parse_mem_limit(real("get_default_device_pinned_mem_limit",
                                           "1500M-kept-as-1G")) == ("1G", 2**30)
    assert clientinfo.parse_device_clients(real("get_device_client_list", "four-clients")) \
        == {0: 4}


def test_the_fake_daemon_prints_the_real_formats(site, sleepers: List[int]) -> None:
    d = site.start_daemon()
    assert d.query("get_default_device_pinned_mem_limit 0").stdout == ""
    d.query("set_default_active_thread_percentage 60")
    d.query("set_default_device_pinned_mem_limit 0 1500M")
    assert d.query("get_default_device_pinned_mem_limit 0").stdout == "1G\n"
    pid = sleepers[0] if sleepers else None
    assert pid is not None
    server = d.query(f"fake_client_connect {pid} 0").stdout.strip()
    ps = d.query("ps").stdout.splitlines()
    real_ps = real("ps", "four-clients").splitlines()
    assert ps[0] == real_ps[0]  # the header, trailing spaces and all
    # The same columns: PID, ID, SERVER, DEVICE, NAMESPACE start where the real ones do.
    starts = [real_ps[1].index(w) for w in real_ps[1].split()[:5]]
    assert [ps[1].index(w, s) for w, s in zip(ps[1].split()[:5], starts)] == starts
    assert d.query(f"get_active_thread_percentage {server}").stdout == "60.0\n"
    assert d.query(f"get_device_pinned_mem_limit {server} 0").stdout == "1G\n"
    assert clientinfo.parse_device_clients(d.query(f"get_device_client_list {server}").stdout) \
        == {0: 1}
    query = d.query("device_query").stdout
    real_query = real("device_query", "one-server")
    assert query.splitlines()[:3] == real_query.splitlines()[:3]
    assert set(clientinfo.parse_device_query(query)) == {"default", server}
    assert d.query("get_active_thread_percentage 1").stdout == \
        real("get_active_thread_percentage", "unknown-pid")


@pytest.fixture
def sleepers() -> Iterator[List[int]]:
    p = subprocess.Popen(["sleep", "120"])
    yield [p.pid]
    p.kill()
    p.wait()


# --- who a client is (/proc) ------------------------------------------------------------

def test_job_from_environ_or_cgroup() -> None:
    env = {"SLURM_JOB_ID": "101", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    info = clientinfo.interpret(env, "read", b"python3\0x.py\0", "")
    assert (info.job_id, info.job_from, info.thread_percentage) == ("101", "environ", 30.0)
    # Slurm's cgroup hierarchies (slurm.schedmd.com/cgroup_v2.html, cgroups.html).
    v2 = "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n"
    v1 = "12:memory:/slurm/uid_1000/job_77/step_batch\n"
    assert clientinfo.interpret({}, "read", b"", v2)[1:3] == ("123", "cgroup")
    assert clientinfo.interpret({}, "read", b"", v1)[1:3] == ("77", "cgroup")
    # The H200's own cgroup names no job (no Slurm there).
    assert clientinfo.parse_cgroup("0::/process_api/75d440ef7471afb4ffa1cdcf72022331\n")[0] == ""
    # A job id that is not a number is not taken; a bad percentage is no percentage.
    bad = clientinfo.interpret({"SLURM_JOB_ID": "1;rm", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE":
                                "lots"}, "read", b"", "")
    assert (bad.job_id, bad.thread_percentage) == ("", None)


def test_environ_read_is_bounded_and_a_cut_entry_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    big = "X" * 5000
    env = dict(os.environ, SLURM_JOB_ID="42", PAD=big, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")
    p = subprocess.Popen(["sleep", "60"], env=env)
    try:
        from mps_health.probes.proc import identity

        for _ in range(500):  # until the child has exec'd (before, /proc shows our environ)
            if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep"):
                break
            time.sleep(0.01)

        start = identity("/proc", p.pid)[1]  # type: ignore[index]
        whole = clientinfo.read_client("/proc", p.pid, start)
        assert (whole.environ, whole.job_id, whole.thread_percentage) == ("read", "42", 25.0)
        data = Path(f"/proc/{p.pid}/environ").read_bytes()
        cut_at = data.index(b"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=") + 36  # inside the value
        monkeypatch.setattr(clientinfo, "ENVIRON_CAP", cut_at)
        cut = clientinfo.read_client("/proc", p.pid, start)
        assert cut.environ == "truncated"
        assert cut.thread_percentage is None  # a cut value is never read as a number
        # Another process's start time: the PID was reused, nothing is taken from it.
        assert clientinfo.read_client("/proc", p.pid, start + 1).environ == "gone"
    finally:
        p.kill()
        p.wait()
    assert clientinfo.read_client("/proc", p.pid, start).environ == "gone"


# --- the checks (pure) ------------------------------------------------------------------

INST = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
JOBS = parse_squeue("101|alice|999|RUNNING|0:42|gres:mps:30\n"
                    "102|alice|999|RUNNING|0:42|gres:mps:50\n"
                    "103|alice|999|RUNNING|0:42|gres:gpu:1\n"
                    "104|alice|999|RUNNING|0:42|gres/mps:20\n")


def client(pid: int, job: str, pct=None, environ: str = "read", pipe=None) -> ClientFact:
    return ClientFact(pid, 999, "alice", pid * 10, "python3 x.py", job,
                      "environ" if job else "", environ, pct, "", pipe)


def server(*clients: ClientFact, pct=60.0, devices=None) -> ServerFact:
    devs = devices if devices is not None else (DeviceFact(0, UUID, "NVIDIA H200",
                                                           "0000:00.06.00", "4G", 4 * 2**30,
                                                           len(clients)),)
    return ServerFact(569, "ACTIVE", "", 999, "alice", 5690, tuple(clients), pct, devs)


LISTED = JobsFacts("vm", JOBS)


def run_check(srv: ServerFact, jobs=LISTED, raw=None, inst=INST):
    from mps_health.checks.clients import check

    facts = Facts("vm", 0.0, "/", (inst,), {
        "servers": ServersFacts(0.0, {inst.name: InstanceServers("ok", "", 1, 1, (srv,), 0.0)},
                                {}, ()),
        "jobs": jobs}, {}, {})
    return list(check(facts, from_mapping(raw or {}, None)))


def codes(results) -> List[str]:
    return [r.code for r in results if r.state]


def test_gres_counts() -> None:
    assert [gres_count(j, "mps") for j in JOBS] == [30, 50, None, 20]
    assert gres_count(SlurmJob("1", "u", 1000, "RUNNING", 1.0, "gres:mps:a100:25"), "mps") == 25


def test_the_h200_scenario_is_judged_as_the_run_saw_it() -> None:
    srv = server(client(504, "101", 30.0), client(506, "102", 100.0),
                 client(505, "103", None), client(503, "104", 20.0))
    results = run_check(srv)
    problems = [r for r in results if r.state]
    assert codes(results) == ["client-over-limit", "client-not-mps-job"]
    over, not_mps = problems
    assert over.state == WARNING and "client 506 (alice, job 102) may use 60%" in over.message
    assert "its environment says 100, its server 569 allows 60" in over.message
    assert "asked for mps:50 (50%)" in over.message
    assert "client 505 (alice, job 103)" in not_mps.message
    assert "'gres:gpu:1', not mps" in not_mps.message
    assert "CUDA_MPS_PIPE_DIRECTORY is unset" in not_mps.message
    summary = next(r for r in results if r.state == 0 and dict(r.values).get("clients"))
    assert dict(summary.values) == {"clients": 4.0, "clients_not_mps_job": 1.0,
                                    "clients_over_limit": 1.0, "jobs": 4.0,
                                    "clients_job_mismatch": 0.0}
    device = next(r for r in results if r.labels)
    assert device.labels == (("UUID", UUID),)
    assert dict(device.values) == {"contexts_limit": 48.0, "contexts": 4.0,
                                   "server_thread_percentage": 60.0,
                                   "server_pinned_mem_limit_bytes": 4 * 2**30}


def test_no_env_means_the_servers_limit() -> None:
    # mps:30 job, no variable in its environment: the server's 60 % applies.
    assert codes(run_check(server(client(504, "101", None)))) == ["client-over-limit"]
    # Its environment cannot be read (not root): not judged, said in the summary.
    results = run_check(server(client(504, "101", None, environ="denied")))
    assert codes(results) == []
    assert "1 environments unreadable" in results[0].message


def test_mps_per_gpu_scales_what_a_job_asked() -> None:
    # Count=200 per GPU: mps:50 is a quarter of the GPU; the env's 30 is more than that.
    raw = {"slurm": {"mps_per_gpu": 200}}
    assert codes(run_check(server(client(506, "102", 30.0)), raw=raw)) == ["client-over-limit"]


def test_clients_near_the_cap() -> None:
    dev = DeviceFact(0, UUID, "NVIDIA H200", "0000:00.06.00", "", None, 44)
    results = run_check(server(devices=(dev,)))
    assert codes(results) == ["clients-near-cap"]
    assert "44 client contexts on GPU " + UUID in results[0].message
    assert "limit is 48 per GPU (warned from 44)" in results[0].message
    dev = dev._replace(contexts=43)
    assert codes(run_check(server(devices=(dev,)))) == []
    raw = {"clients": {"max_contexts_per_device": 40, "contexts_warn_ratio": 1.0}}
    assert codes(run_check(server(devices=(dev,)), raw=raw)) == ["clients-near-cap"]


def test_a_server_spanning_gpus_where_each_instance_serves_one() -> None:
    two = tuple(DeviceFact(i, f"GPU-{i}", "NVIDIA H200", "", "", None, 0) for i in range(2))
    gpu0 = Instance("gpu0", "per-gpu", "/tmp/nvidia-mps_0", "/var/log/nvidia-mps_0", "0")
    per_gpu = {"mps": {"layout": "per-gpu", "gpus": [0, 1]}}
    results = run_check(server(devices=two), raw=per_gpu, inst=gpu0)
    assert codes(results) == ["server-spans-gpus"]
    assert "uses 2 GPUs (GPU-0, GPU-1)" in results[0].message
    # A node-wide daemon may serve every GPU, unless the config asks for isolation.
    assert codes(run_check(server(devices=two))) == []
    assert codes(run_check(server(devices=two),
                           raw={"clients": {"per_gpu_isolation": True}})) == ["server-spans-gpus"]


def test_jobs_unknown_is_unknown_only_when_clients_have_jobs() -> None:
    failed = JobsFacts("vm", None, "squeue: Unable to contact slurm controller")
    results = run_check(server(client(504, "101", 30.0)), jobs=failed)
    assert [(r.code, r.state) for r in results if r.state] == \
        [("slurm-jobs-unavailable", UNKNOWN)]
    assert codes(run_check(server(client(504, "", None)), jobs=failed)) == []
    # A client whose job squeue does not list (ended, or started after squeue): not judged.
    assert codes(run_check(server(client(504, "999", 100.0)))) == []


def test_hostile_text_is_escaped() -> None:
    evil = client(505, "103", None)._replace(user="x\n\x1b[31mOK")
    results = run_check(server(evil))
    assert all("\n" not in r.message and "\x1b" not in r.message for r in results)
    assert "x\\x0a\\x1b[31mOK" in results[0].message


def test_bad_config_is_one_line_at_load() -> None:
    from mps_health.config.load import ConfigError

    with pytest.raises(ConfigError, match=r"'clients\.contexts_warn_ratio': must be a number"):
        from_mapping({"clients": {"contexts_warn_ratio": 2}}, "site.yaml")
    with pytest.raises(ConfigError, match=r"'clients\.per_gpu_isolation': must be true, false"):
        from_mapping({"clients": {"per_gpu_isolation": "yes"}}, "site.yaml")


# --- end to end on the fake daemon ------------------------------------------------------

SQUEUE = ("#!/bin/sh\n# squeue -h -w NODE -o '%A|%u|%U|%T|%M|%b' (lines as Slurm 22.05 prints)\n"
          "printf '101|root|0|RUNNING|0:42|gres:mps:30\\n103|root|0|RUNNING|0:42|gres:gpu:1\\n'\n")


def test_view_and_check_end_to_end(tmp_path: Path, site) -> None:
    squeue = tmp_path / "squeue"
    squeue.write_text(SQUEUE)
    squeue.chmod(0o755)
    d = site.start_daemon(FAKE_MPS_PERCENTAGE="60.0")
    # gres_conf: the snapshot (--all) reads it, and the host's is not ours to read
    cfg = site.config(f"commands:\n  squeue: {squeue}\nclients: {{}}\n"
                      f"slurm:\n  gres_conf: {tmp_path}/gres.conf\n")
    procs = [subprocess.Popen(["\x1b[2Jsleep", "120"], executable="/bin/sleep", env=dict(
        os.environ, SLURM_JOB_ID=job, **({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct} if pct
                                         else {})))
        for job, pct in (("101", "30"), ("103", ""))]
    try:
        for p in procs:
            d.query(f"fake_client_connect {p.pid} 0")
        r = mps_health("clients", "--config", cfg)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\\x1b[2Jsleep 120" in r.stdout, r.stdout
        lines = r.stdout.splitlines()
        row = next(ln for ln in lines if ln.strip().startswith(str(procs[0].pid)))
        assert "101" in row and "gres:mps:30" in row and "30% (env 30)" in row
        row = next(ln for ln in lines if ln.strip().startswith(str(procs[1].pid)))
        assert "gres:gpu:1" in row and "60%" in row
        assert "threads 60%" in r.stdout and UUID in r.stdout
        data = json.loads(mps_health("clients", "--config", cfg, "--format", "json").stdout)
        srv = data["instances"][0]["servers"][0]
        assert srv["thread_percentage"] == 60.0 and srv["devices"][0]["uuid"] == UUID
        assert [c["job_id"] for c in srv["clients"]] == ["101", "103"]
        assert srv["clients"][1]["env_pipe_dir"] is None
        check = mps_health("check", "--config", cfg, "--only", "clients", "--format", "json")
        found = [p["code"] for p in json.loads(check.stdout)["problems"]]
        assert found == ["client-not-mps-job"] and check.returncode == 1
        snap = tmp_path / "snap.json"
        assert mps_health("snapshot", "--config", cfg, "--all", "-o", str(snap)).returncode == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # The snapshot judges and shows the same with the clients gone.
    replay = mps_health("check", "--replay", str(snap), "--only", "clients")
    assert "client-not-mps-job" in replay.stdout and replay.returncode == 1
    view = mps_health("clients", "--replay", str(snap))
    assert view.returncode == 0 and str(procs[0].pid) in view.stdout


def test_idle_daemon_asks_nothing(site) -> None:
    d = site.start_daemon()
    cfg = site.config("commands:\n  squeue: /nonexistent\n")
    r = mps_health("clients", "--config", cfg)
    assert r.returncode == 0 and "no server runs" in r.stdout
    assert "squeue" not in r.stdout  # not even asked: no client to judge
    r = mps_health("check", "--config", cfg, "--only", "clients", "-v")
    assert r.returncode == 0 and "no server runs, so no client" in r.stdout
    log = (d.log_dir / "control.log").read_text()
    assert "Cmd:ps" not in log and "Cmd:device_query" not in log


# --- the H200 run, replayed ---------------------------------------------------------------

@pytest.mark.parametrize("phase", ["alice", "bob"])
def test_the_h200_snapshots_replay_to_the_same_view(phase: str) -> None:
    """Snapshots taken on the H200 (tests/gpu/clients_scenario.py) print here exactly what
    `mps-health clients` printed there: NVML's memory per client included."""
    snap = FIXTURES / f"snapshot__h200-clients_{phase}.json"
    r = mps_health("clients", "--replay", str(snap))
    assert r.returncode == 0, r.stderr
    assert r.stdout == fixture_text(f"mps-health_clients__h200_{phase}.txt")


def test_the_h200_alice_snapshot_is_judged_as_there() -> None:
    snap = FIXTURES / "snapshot__h200-clients_alice.json"
    r = mps_health("check", "--replay", str(snap), "--format", "json")
    found = sorted((p["code"], p["message"].split(")")[0])
                   for p in json.loads(r.stdout)["problems"])
    # Recorded when the unit made log dirs 0777: now a log-dir-mode WARNING too.
    assert found == [("client-not-mps-job", "client 533 (mpsh-alice, job 103"),
                     ("client-over-limit", "client 532 (mpsh-alice, job 102"),
                     ("log-dir-mode", "log dir /tmp/mpsh-clients-work/log has mode 0777, "
                      "expected 0755 (mps.log_dir_mode")]
    assert r.returncode == 1


def test_nvml_memory_of_mps_clients_from_the_h200_recording() -> None:
    from mps_health.probes.nvml import load_record, read_nvml

    rec = load_record(fixture_text("nvml__h200_mps-clients.json"), "fixture")
    gpu = read_nvml(rec).gpus[0]
    clients = {p.pid: p.used_memory_bytes for p in gpu.mps_processes or ()}
    everyone = {p.pid for p in gpu.processes or ()}
    assert sorted(clients) == [530, 531, 532, 533]  # the clients only
    assert everyone - set(clients) == {596}  # the compute list adds the server
    assert clients[531] == 473956352  # the env-30 client holds less than the others


def test_servers_not_listed_is_unknown(site) -> None:
    pipe, _ = site.dirs()
    cfg = site.config("commands:\n  nvidia-cuda-mps-control: /nonexistent\n"
                      "  squeue: /nonexistent\n")
    (pipe / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))  # not a daemon
    r = mps_health("clients", "--config", cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "servers not listed: exec-failed: /nonexistent" in r.stdout
    assert "squeue" not in r.stdout  # no live daemon: no client, no job list asked


def test_a_failing_squeue_is_named_once(tmp_path: Path, site) -> None:
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller "
                      "(connect failure)' >&2\nexit 1\n")
    squeue.chmod(0o755)
    d = site.start_daemon()
    cfg = site.config(f"commands:\n  squeue: {squeue}\nclients: {{}}\n")
    sleeper = subprocess.Popen(["sleep", "120"], env=dict(os.environ, SLURM_JOB_ID="101"))
    try:
        d.query(f"fake_client_connect {sleeper.pid} 0")
        r = mps_health("clients", "--config", cfg)
        check = mps_health("check", "--config", cfg, "--only", "clients", "-v")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "note: jobs: squeue: error: Unable to contact slurm controller" in r.stdout, r.stdout
    # The check says it too (slurm-jobs-unavailable) once it has seen the server.
    assert "squeue: squeue" not in r.stdout + check.stdout, r.stdout + check.stdout
