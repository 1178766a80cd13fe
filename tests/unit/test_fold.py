"""A cause is one problem: findings that follow from another are folded under it
(model/results.py ``fold``), and every output counts only what is left."""

import io
import json

from mps_health.exporters import json as json_out
from mps_health.exporters import nagios, prometheus, text
from mps_health.model.results import (
    CRITICAL,
    FOLDS,
    OK,
    UNKNOWN,
    WARNING,
    CheckRun,
    Report,
    Result,
    fold,
)
from test_runbook import declared

RESET = "run 'mps-health remediate reset mps' (dry run first: --dry-run)"


def not_installed(instance: str = "mps", state: int = CRITICAL) -> Result:
    return Result("daemon", state, "mps-not-installed", instance,
                  "MPS is not installed on this node (x: command not found)",
                  "install the NVIDIA driver's MPS binaries", (("daemon_up", 0.0),))


def runs(*results: Result) -> list:
    by_check: dict = {}
    for r in results:
        by_check.setdefault(r.check, []).append(r)
    return [CheckRun(name, tuple(rs), 0.001) for name, rs in by_check.items()]


def no_binaries(instance: str = "mps") -> list:
    """What a node without the MPS binaries finds: the cause and its consequences."""
    return runs(
        not_installed(instance),
        Result("control", UNKNOWN, "control-client-missing", instance,
               "x: command not found", "install the CUDA MPS binaries"),
        Result("directories", CRITICAL, "pipe-dir-missing", instance,
               "/tmp/nvidia-mps does not exist", RESET),
        Result("directories", WARNING, "log-dir-missing", instance,
               "/var/log/nvidia-mps does not exist", RESET),
    )


def report_of(folded) -> Report:
    return Report("node1", 0.0, 0.01, tuple(folded), {}, "test")


def test_the_consequences_are_folded_under_their_cause_and_lose_their_advice() -> None:
    folded = fold(no_binaries())
    results = [r for run in folded for r in run.results]
    cause = results[0]
    assert cause.code == "mps-not-installed" and cause.cause == "" and cause.action
    for r in results[1:]:
        assert r.cause == "mps-not-installed", r
        assert r.action == ""  # no line advises a reset the cause makes pointless
        assert r.message  # still said
    assert [r.state for r in results[1:]] == [UNKNOWN, CRITICAL, WARNING]  # kept, not counted


def test_the_report_counts_one_problem_with_the_cause_s_severity() -> None:
    report = report_of(fold(no_binaries()))
    assert [r.code for r in report.problems()] == ["mps-not-installed"]
    assert report.state == CRITICAL
    per_check = {run.name: run.state for run in report.runs}
    assert per_check == {"daemon": CRITICAL, "control": OK, "directories": OK}


def test_a_per_job_cause_is_a_warning_and_so_is_the_node() -> None:
    results = runs(not_installed("job1", WARNING),
                   Result("directories", CRITICAL, "pipe-dir-missing", "job1", "gone", RESET))
    report = report_of(fold(results))
    assert report.state == WARNING and len(report.problems()) == 1


def test_only_the_cause_s_own_instance_and_the_node_s_findings_fold() -> None:
    results = runs(
        not_installed("gpu0"),
        Result("directories", CRITICAL, "pipe-dir-missing", "gpu1", "gone", RESET),
        Result("gres_drift", WARNING, "mps-gpu-unserved", "", "gpu 0 unserved", "fix it"),
    )
    folded = {(r.instance, r.code): r.cause for run in fold(results) for r in run.results}
    assert folded[("gpu1", "pipe-dir-missing")] == ""  # another instance: its own problem
    assert folded[("", "mps-gpu-unserved")] == "mps-not-installed"


def test_nothing_an_attacker_causes_is_folded() -> None:
    results = runs(
        not_installed(),
        Result("directories", CRITICAL, "pipe-dir-symlink", "mps", "a link", "remove it"),
        Result("strays", CRITICAL, "mps-impostor", "", "an impostor", "end it"),
    )
    assert [r.cause for run in fold(results) for r in run.results] == ["", "", ""]


def test_without_a_cause_nothing_changes() -> None:
    results = runs(Result("directories", CRITICAL, "pipe-dir-missing", "mps", "gone", RESET),
                   Result("control", UNKNOWN, "control-client-missing", "mps", "x", "y"))
    assert fold(results) == tuple(results)
    ok_cause = runs(Result("daemon", OK, "ok", "mps", "fine"),
                    Result("directories", CRITICAL, "pipe-dir-missing", "mps", "gone", RESET))
    assert fold(ok_cause) == tuple(ok_cause)


def test_every_code_in_the_table_is_one_a_check_reports() -> None:
    codes = declared()
    for cause, folded in FOLDS.items():
        assert cause in codes, cause
        assert folded <= codes, folded - codes


def test_every_output_agrees() -> None:
    report = report_of(fold(no_binaries()))
    out = text.render(report).splitlines()
    assert out[0].startswith("MPS CRITICAL - 1 problem: mps-not-installed mps"), out
    assert len(out) == 2 and "remediate reset" not in "\n".join(out)
    verbose = text.render(report, verbose=True)
    assert "FOLDED directories[mps] pipe-dir-missing: /tmp/nvidia-mps does not exist " \
        "(follows from mps-not-installed)" in verbose
    assert "remediate reset" not in verbose

    out = io.StringIO()
    json_out.write(report, out)
    doc = json.loads(out.getvalue())
    assert doc["exit_code"] == 2 and [p["code"] for p in doc["problems"]] == ["mps-not-installed"]
    kept = [r for c in doc["checks"] for r in c["results"] if "cause" in r]
    assert {r["code"] for r in kept} == {"control-client-missing", "pipe-dir-missing",
                                         "log-dir-missing"}
    assert all(r["cause"] == "mps-not-installed" and r["action"] == "" for r in kept)

    warning, critical = nagios.thresholds(None, None, 1.0)
    plugin, code = nagios.render(nagios.Probe(lambda: report), warning, critical, 1)
    assert code == 2
    assert plugin.startswith("MPS CRITICAL - mps-not-installed mps: "), plugin
    assert "also" not in plugin.splitlines()[0] and "remediate reset" not in plugin
    assert "FOLDED directories[mps] pipe-dir-missing: " in plugin, plugin

    assert prometheus.run_success(report)  # a folded UNKNOWN leaves no check blind
    problems = prometheus._problem_family(report)
    assert [s.labels["code"] for s in problems.samples] == ["mps-not-installed"]


def test_with_no_daemon_the_canary_s_findings_fold_under_it_and_the_cause_counts() -> None:
    results = runs(
        Result("daemon", CRITICAL, "daemon-absent", "gpu0", "no daemon", RESET),
        Result("canary", CRITICAL, "canary-not-served", "gpu0", "no server listed it", RESET),
        Result("canary", CRITICAL, "canary-not-served", "gpu1", "no server listed it", RESET),
        Result("directories", CRITICAL, "pipe-dir-symlink", "gpu0", "a link", "remove it"),
    )
    folded = {(r.instance, r.code): r.cause for run in fold(results) for r in run.results}
    assert folded[("gpu0", "canary-not-served")] == "daemon-absent"
    assert folded[("gpu1", "canary-not-served")] == ""  # another instance: its own problem
    assert folded[("gpu0", "daemon-absent")] == ""
    assert folded[("gpu0", "pipe-dir-symlink")] == ""  # what a user causes never folds
    report = report_of(fold(results))
    assert [(r.instance, r.code) for r in report.problems()] == [
        ("gpu0", "daemon-absent"), ("gpu1", "canary-not-served"), ("gpu0", "pipe-dir-symlink")]


def test_a_dead_daemon_folds_what_follows_but_never_a_more_severe_finding() -> None:
    reset = "run 'mps-health remediate reset node'"
    node = runs(Result("daemon", CRITICAL, "daemon-stale", "node", "dead", reset),
                Result("control", CRITICAL, "control-absent", "node", "no daemon", reset),
                Result("servers", UNKNOWN, "servers-not-asked", "node", "not asked", ""))
    assert [r.code for r in report_of(fold(node)).problems()] == ["daemon-stale"]
    # A per-job instance's absent daemon is a WARNING; its control-absent, CRITICAL, counts.
    job = runs(Result("daemon", WARNING, "daemon-absent", "job1", "none", reset),
               Result("control", CRITICAL, "control-absent", "job1", "no daemon", reset),
               Result("directories", WARNING, "log-dir-missing", "job1", "gone", reset))
    report = report_of(fold(job))
    assert [r.code for r in report.problems()] == ["daemon-absent", "control-absent"]
    assert report.state == CRITICAL
