"""The limits check on made facts: the limits each running server applies against the
daemon's defaults (and a per-job instance's mps share), and the device IDs the default
pinned limits were set on (control.log's ``Cmd:`` lines)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from mps_health.config.load import from_mapping
from mps_health.exporters.series import samples
from mps_health.healthcheck.slurmnode import by_any_user
from mps_health.model.facts import ControlAnswer, Facts, Instance
from mps_health.model.facts_deep import (
    DeviceFact,
    InstanceServers,
    LogFinding,
    LogsFacts,
    ServerFact,
    ServersFacts,
)
from mps_health.model.results import WARNING, Result
from mps_health.probes.jobs import JobsFacts
from mps_health.probes.logs import parse_findings
from mps_health.probes.slurm import parse_squeue

UUID0 = "GPU-05803005-9e7a-c129-2f1f-b83ee0421857"
UUID1 = "GPU-11111111-2222-3333-4444-555555555555"
INST = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
JOB_INST = Instance("job77", "per-job", "/tmp/nvidia-mps_job77", "/tmp/nvidia-log_job77",
                    job_id="77")


def server(pid: int = 1234, pct: Optional[float] = 100.0,
           limits: Tuple[str, str] = ("", "")) -> ServerFact:
    devs = tuple(DeviceFact(i, u, "NVIDIA H200", f"0000:00.0{6 + i}.00", limit,
                            {"": None, "4G": 4 << 30, "2G": 2 << 30}[limit], 1)
                 for i, (u, limit) in enumerate(zip((UUID0, UUID1), limits)))
    return ServerFact(pid, "ACTIVE", "", 1002, "mpshvictim", pid * 10, (), pct, devs)


def instance_servers(*servers: ServerFact, defaults: Tuple[str, str] = ("", "")
                     ) -> InstanceServers:
    return InstanceServers("ok", "", 1, 1, servers, 0.0,
                           tuple(enumerate(defaults)), ((0, UUID0), (1, UUID1)))


def answer(pct: str = "100.0") -> ControlAnswer:
    return ControlAnswer("get_default_active_thread_percentage", "ok", 0, pct + "\n", "",
                         0.01)


def log_sets(*settings: Tuple[str, str], log_dir: str = INST.log_dir) -> LogsFacts:
    findings = tuple(LogFinding(100.0 + i, "log-pinned-limit-set", log_dir, "control.log",
                                f"Cmd:set_default_device_pinned_mem_limit {dev} {value}")
                     for i, (dev, value) in enumerate(settings))
    return LogsFacts(200.0, (), findings, ())


def run(cur: InstanceServers, default: str = "100.0", logs: Optional[LogsFacts] = None,
        inst: Instance = INST, jobs: Optional[JobsFacts] = None) -> List[Result]:
    from mps_health.checks.limits import check

    sources: Dict[str, object] = {
        "servers": ServersFacts(0.0, {inst.name: cur}, {}, ()),
        "control": {inst.name: answer(default)},
        "logs": logs or LogsFacts(200.0, (), (), ())}
    if jobs is not None:
        sources["jobs"] = jobs
    facts = Facts("vm", 0.0, "/", (inst,), sources, {}, {})  # type: ignore[arg-type]
    return list(check(facts, from_mapping({}, None)))


def problems(results: List[Result]) -> List[Tuple[str, int]]:
    return [(r.code, r.state) for r in results if r.state]


def test_a_server_applying_the_defaults_is_ok() -> None:
    results = run(instance_servers(server(pct=50.0, limits=("4G", "")),
                                   defaults=("4G", "")), default="50.0")
    assert problems(results) == []


def test_a_default_thread_percentage_changed_after_the_server_started() -> None:
    results = run(instance_servers(server(pct=100.0)), default="50.0")
    assert problems(results) == [("limits-not-in-force", WARNING)]
    found = next(r for r in results if r.state)
    assert "server 1234 (mpshvictim) applies 100% active threads, the default is 50% " \
        "(set after it started)" in found.message
    assert "next server" in found.action
    summary = dict(next(r for r in results if r.state == 0 and not r.labels).values)
    assert summary == {"limits_not_in_force": 1.0, "default_thread_percentage": 50.0,
                       "applied_thread_percentage": 100.0}


def test_a_default_pinned_limit_changed_after_the_server_started() -> None:
    results = run(instance_servers(server(limits=("", "")), defaults=("4G", "")))
    assert problems(results) == [("limits-not-in-force", WARNING)]
    found = next(r for r in results if r.state)
    assert f"applies a pinned memory limit of no limit on GPU {UUID0}, the default is 4G" \
        in found.message
    assert ("UUID", UUID0) in found.labels
    per_gpu = {dict(r.labels)["UUID"]: dict(r.values) for r in results
               if r.state == 0 and r.labels}
    assert per_gpu == {UUID0: {"default_pinned_mem_limit_bytes": float(4 << 30)}}


def test_the_applied_value_shown_is_the_one_that_differs() -> None:
    results = run(instance_servers(server(1, pct=50.0, limits=("4G", "")),
                                   server(2, pct=100.0, limits=("2G", "")),
                                   defaults=("4G", "")), default="50.0")
    assert [r.message.split(" applies")[0] for r in results if r.state] == \
        ["server 2 (mpshvictim)", "server 2 (mpshvictim)"]
    rep_values = {(s.metric, s.labels): s.value for s in samples(_report(results))}
    assert rep_values[("mps_health_limits_applied_thread_percentage",
                       (("mps_instance", "node"),))] == 100.0
    assert rep_values[("mps_health_limits_applied_pinned_mem_limit_bytes",
                       (("mps_instance", "node"), ("UUID", UUID0)))] == float(2 << 30)
    assert rep_values[("mps_health_limits_default_pinned_mem_limit_bytes",
                       (("mps_instance", "node"), ("UUID", UUID0)))] == float(4 << 30)


def _report(results: List[Result]):  # -> Report
    from mps_health.model.results import CheckRun, Report

    return Report("vm", 0.0, 0.1, (CheckRun("limits", tuple(results), 0.001),), {}, "0")


def test_an_unknown_default_judges_nothing() -> None:
    cur = instance_servers(server(pct=100.0))
    from mps_health.checks.limits import check

    facts = Facts("vm", 0.0, "/", (INST,), {
        "servers": ServersFacts(0.0, {INST.name: cur}, {}, ()),
        "control": {INST.name: ControlAnswer("q", "timeout", None, "", "", 2.0)},
        "logs": LogsFacts(0.0, (), (), ())}, {}, {})
    assert [r.code for r in check(facts, from_mapping({}, None)) if r.state] == []


def test_an_idle_or_unasked_instance_is_not_judged_twice() -> None:
    idle = InstanceServers("idle", "no server", 1, 1, (), 0.0)
    assert problems(run(idle, default="50.0")) == []
    wedged = InstanceServers("timeout", "no answer", 1, 1, (), 0.0)
    assert problems(run(wedged)) == []  # the servers check says servers-not-asked


def test_per_job_more_threads_than_the_jobs_share() -> None:
    jobs = JobsFacts("vm", parse_squeue("77|mpshvictim|1002|RUNNING|1:00|gres:mps:25\n"))
    results = run(instance_servers(server(pct=100.0)), default="100.0", inst=JOB_INST,
                  jobs=jobs)
    assert problems(results) == [("limits-not-in-force", WARNING)]
    assert "job 77's --gres=mps:25 is 25%" in next(r for r in results if r.state).message
    ok = run(instance_servers(server(pct=25.0)), default="25.0", inst=JOB_INST, jobs=jobs)
    assert problems(ok) == []


def test_a_limit_set_by_index_and_by_uuid_for_one_gpu() -> None:
    results = run(instance_servers(server(limits=("2G", "")), defaults=("2G", "")),
                  logs=log_sets(("0", "4G"), (UUID0, "2G")))
    assert problems(results) == [("pinned-limit-ambiguous", WARNING)]
    message = next(r for r in results if r.state).message
    assert f"by index (0 4G) and by UUID ({UUID0} 2G)" in message
    assert "the daemon keeps both" in message and "not the last set" in message


def test_one_id_per_gpu_is_fine_and_other_dirs_do_not_count() -> None:
    cur = instance_servers(server(limits=("4G", "2G")), defaults=("4G", "2G"))
    assert problems(run(cur, logs=log_sets(("0", "4G"), (UUID1, "2G"), ("0", "4G")))) == []
    other = log_sets(("0", "4G"), (UUID0, "2G"), log_dir="/tmp/elsewhere")
    assert problems(run(cur, logs=other)) == []


def test_a_limit_set_on_an_id_that_names_no_gpu() -> None:
    results = run(instance_servers(server()), logs=log_sets(("7", "4G"), ("GPU-bogus", "1G")))
    assert problems(results) == [("pinned-limit-unknown-device", WARNING)]
    message = next(r for r in results if r.state).message
    assert "(7 4G, GPU-bogus 1G)" in message and "the daemon ignores them" in message
    assert f"0 / {UUID0}" in message


def test_settings_of_an_earlier_daemon_do_not_count() -> None:
    logs = log_sets(("0", "4G"), (UUID0, "2G"))
    start = LogFinding(150.0, "log-daemon-start", INST.log_dir, "control.log",
                       "Starting control daemon using socket /tmp/nvidia-mps/control")
    later = LogFinding(160.0, "log-pinned-limit-set", INST.log_dir, "control.log",
                       "Cmd:set_default_device_pinned_mem_limit 0 4G")
    cur = instance_servers(server(limits=("4G", "")), defaults=("4G", ""))
    assert problems(run(cur, logs=logs._replace(findings=(*logs.findings, start, later)))) \
        == []
    assert [f.code for f in parse_findings(
        "[2026-12-02 13:00:33.310 Control  1066] Starting control daemon using socket "
        "/tmp/p/control\n", INST.log_dir, "control.log", 0.0)] == ["log-daemon-start"]


def test_ids_are_not_judged_without_the_device_table() -> None:
    cur = InstanceServers("ok", "", 1, 1, (server(),), 0.0)
    assert problems(run(cur, logs=log_sets(("7", "4G")))) == []


def test_text_from_the_log_is_escaped() -> None:
    results = run(instance_servers(server()), logs=log_sets(("\x1b[2Jx", "4G")))
    message = next(r for r in results if r.state).message
    assert "\x1b" not in message


def test_the_logs_probe_keeps_the_setting_lines_only() -> None:
    text = ("[2026-12-02 13:00:34.315 Control  1066] Cmd:set_default_device_pinned_mem_limit "
            f"{UUID0} 2G\n"
            "[2026-12-02 13:00:34.316 Control  1066] Cmd:get_default_device_pinned_mem_limit 0\n"
            "[2026-12-02 13:00:34.317 Control  1066] Cmd:bogus "
            "Cmd:set_default_device_pinned_mem_limit 0 1G\n")
    found = parse_findings(text, "/var/log/nvidia-mps", "control.log", 0.0)
    assert [(f.code, f.text) for f in found] == [
        ("log-pinned-limit-set", f"Cmd:set_default_device_pinned_mem_limit {UUID0} 2G")]


def test_the_logs_check_does_not_report_the_setting_lines() -> None:
    from mps_health.checks.logs import check

    facts = Facts("vm", 0.0, "/", (INST,), {"logs": log_sets(("0", "4G"))}, {}, {})
    assert [r.code for r in check(facts, from_mapping({}, None)) if r.state] == []


def test_no_finding_of_this_check_ever_drains() -> None:
    from mps_health.checks.limits import CODES

    for code in CODES:
        assert by_any_user(Result("limits", WARNING, code, "node", "m"))
