"""The metric contract (docs/metrics.md): how Result.values become Prometheus series and
Nagios perfdata, for the built-in checks and for value keys any check may give."""

import os
import subprocess
import sys

import pytest
from mps_health.config.load import from_mapping
from mps_health.engine.run import fit_control
from mps_health.exporters import prometheus
from mps_health.exporters.nagios import perf_labels
from mps_health.exporters.series import label_name, metric_name, samples
from mps_health.model.results import CRITICAL, OK, WARNING, CheckRun, Report, Result


@pytest.mark.parametrize("check, key, name", [
    ("daemon", "daemon_up", "mps_health_daemon_up"),
    ("control", "latency_s", "mps_health_control_latency_seconds"),
    ("directories", "dir_ok", "mps_health_dir_ok"),
    ("tmpfiles", "guarded", "mps_health_tmpfiles_guarded"),
    ("control", "thread_percentage", "mps_health_control_thread_percentage"),
    # A key named after its check gives the bare name.
    ("compute_mode", "compute_mode", "mps_health_compute_mode"),
    ("compute-mode", "compute_mode", "mps_health_compute_mode"),
    ("gres_drift", "gres_drift", "mps_health_gres_drift"),
    ("orphans", "orphans", "mps_health_orphans"),
    ("server", "clients", "mps_health_server_clients"),
    ("canary", "first_context_s", "mps_health_canary_first_context_seconds"),
    ("logs", "read_bytes", "mps_health_logs_read_bytes"),
    ("clients", "clients", "mps_health_clients"),
    ("clients", "clients_not_mps_job", "mps_health_clients_not_mps_job"),
    ("clients", "contexts", "mps_health_clients_contexts"),
    ("clients", "server_pinned_mem_limit_bytes",
     "mps_health_clients_server_pinned_mem_limit_bytes"),
    ("clients", "server_thread_percentage", "mps_health_clients_server_thread_percentage"),
    ("limits", "limits_not_in_force", "mps_health_limits_not_in_force"),
    ("limits", "default_thread_percentage", "mps_health_limits_default_thread_percentage"),
    ("limits", "applied_thread_percentage", "mps_health_limits_applied_thread_percentage"),
    ("limits", "default_pinned_mem_limit_bytes",
     "mps_health_limits_default_pinned_mem_limit_bytes"),
    ("limits", "applied_pinned_mem_limit_bytes",
     "mps_health_limits_applied_pinned_mem_limit_bytes"),
    # A value may never shadow the exporter's own series.
    ("check", "success", "mps_health_value_check_success"),
])
def test_metric_names(check: str, key: str, name: str) -> None:
    assert metric_name(check, key) == name


def test_label_names_are_valid_and_never_target_labels() -> None:
    assert [label_name(n) for n in ("gpu", "UUID", "instance", "job", "0x", "__y", "a-b")] == \
        ["gpu", "UUID", "exported_instance", "exported_job", "_0x", "_y", "a_b"]


def report(*results: Result) -> Report:
    runs = {}
    for r in results:
        runs.setdefault(r.check, []).append(r)
    return Report("n1", 0.0, 0.1, tuple(CheckRun(c, tuple(rs), 0.001) for c, rs in runs.items()),
                  {}, "0")


def test_gpu_labels_join_dcgm_exporter() -> None:
    rep = report(
        Result("compute_mode", OK, "ok", "", "m", "", (("compute_mode", 3.0),),
               (("gpu", "0"), ("UUID", "GPU-5d1c"))),
        Result("control", OK, "ok", "gpu1", "m", "", (("latency_s", 0.01),)),
        Result("control", OK, "ok", "gpu2", "m", "", (("latency_s", 0.02),)))
    found = {(s.metric, s.labels) for s in samples(rep, {"gpu1": "1", "gpu2": "GPU-77aa"})}
    assert found == {
        ("mps_health_compute_mode", (("gpu", "0"), ("UUID", "GPU-5d1c"))),
        ("mps_health_control_latency_seconds", (("mps_instance", "gpu1"), ("gpu", "1"))),
        ("mps_health_control_latency_seconds", (("mps_instance", "gpu2"), ("UUID", "GPU-77aa"))),
    }


def test_the_worse_result_wins_a_shared_series() -> None:
    rep = report(
        Result("directories", OK, "ok", "node", "pipe fine", "", (("dir_ok", 1.0),)),
        Result("directories", WARNING, "log-dir-mode", "node", "log bad", "", (("dir_ok", 0.0),)),
        Result("directories", OK, "ok", "node", "again fine", "", (("dir_ok", 1.0),)))
    [s] = samples(rep)
    assert (s.metric, s.value, s.state) == ("mps_health_dir_ok", 0.0, WARNING)


def test_unusable_values_are_dropped_not_fatal() -> None:
    rep = report(Result("x", OK, "ok", "", "m", "", (("a", float("nan")), ("b", "many"),
                                                      ("c", 2.0))))  # type: ignore[arg-type]
    assert [(s.metric, s.value) for s in samples(rep)] == [("mps_health_x_c", 2.0)]


def test_perfdata_labels() -> None:
    rep = report(
        Result("control", CRITICAL, "control-wedged", "node", "m", "", (("latency_s", 2.0),)),
        Result("canary", OK, "ok", "node", "m", "", (("latency_s", 0.3),)),
        Result("daemon", OK, "ok", "node", "m", "", (("daemon_up", 1.0), ("daemon_pid", 42.0))),
        Result("compute_mode", OK, "ok", "", "m", "", (("compute_mode", 3.0),), (("gpu", "0"),)),
        Result("control", OK, "ok", "gpu1", "m", "", (("latency_s", 0.01),)))
    labels = {label: (s.check, s.key) for label, s in perf_labels(samples(rep, {"gpu1": "1"}))}
    assert labels == {  # INSTANCE[_GPU]_NAME, NAME from the metric name
        "node_latency": ("control", "latency_s"),  # the headline number, thresholded
        "node_canary_latency": ("canary", "latency_s"),
        "node_daemon_up": ("daemon", "daemon_up"),  # the pid is an id, not a measurement
        "gpu0_compute_mode": ("compute_mode", "compute_mode"),
        "gpu1_latency": ("control", "latency_s"),  # not gpu1_gpu1_latency
    }


def test_a_failed_run_still_exports_its_timestamps() -> None:
    text = prometheus.exposition(prometheus.RunRecord(None, 1700000000.0, False, 1690000000.0,
                                                      error="boom")).decode()
    assert "mps_health_last_run_timestamp_seconds 1.7e+09" in text
    assert "mps_health_last_success_timestamp_seconds 1.69e+09" in text
    assert "mps_health_run_success 0.0" in text and "mps_health_status" not in text
    assert prometheus.parse_last_success(text) == 1690000000.0
    assert prometheus.parse_last_success("mps_health_last_success_timestamp_seconds x\n") is None


def test_control_timeout_fits_inside_the_budget() -> None:
    config = from_mapping({"control": {"timeout_s": 2.0}}, None)
    assert fit_control(config, 1.4).control.timeout_s == 1.1
    assert fit_control(config, 10.0) is config
    assert fit_control(config, 0.2).control.timeout_s == 0.1


def test_the_check_path_imports_no_monitoring_library(site) -> None:
    site.dirs()
    code = ("import sys; from mps_health.cli import main as cli; cli.main(['check', '--config', sys.argv[1]]);"
            " print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in "
            "('prometheus_client', 'nagiosplugin', 'http')))")
    r = subprocess.run([sys.executable, "-c", code, site.config()],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert "LOADED []" in r.stdout, r.stdout + r.stderr
