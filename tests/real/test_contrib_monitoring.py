"""contrib/ monitoring definitions, validated by the real tools: promtool, icinga2, nagios4.

Each validator is also shown a broken copy, so these tests can fail.
"""

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import yaml
from clirun import mps_health
from conftest import REPO
from monitoring_tools import need
from mps_health.exporters.series import metric_name

CONTRIB = REPO / "contrib"
ALERTS = CONTRIB / "prometheus" / "mps-health-alerts.yml"
ALERT_TESTS = CONTRIB / "prometheus" / "mps-health-alerts.test.yml"
ICINGA = CONTRIB / "icinga2" / "mps-health.conf"
NAGIOS = CONTRIB / "nagios" / "mps-health.cfg"
DASHBOARD = CONTRIB / "grafana" / "mps-health-dashboard.json"


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_checks_and_tests_the_alert_rules(tmp_path: Path) -> None:
    promtool = need("promtool")
    r = run(promtool, "check", "rules", str(ALERTS))
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
    r = run(promtool, "test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # A rule unit test that expects the wrong thing fails: the tests are live.
    (tmp_path / ALERTS.name).write_text(ALERTS.read_text())
    (tmp_path / "bad.test.yml").write_text(ALERT_TESTS.read_text().replace("25m 0s", "24m 0s"))
    r = run(promtool, "test", "rules", "bad.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "MpsHealthStale" in r.stdout + r.stderr


def icinga_config(tmp_path: Path, contrib: Path) -> Path:
    conf = tmp_path / "icinga2.conf"
    conf.write_text(f"""
const PluginDir = "/usr/lib/nagios/plugins"
const NodeName = "monitor.test"
const ZoneName = "master"
object Endpoint NodeName {{}}
object Zone ZoneName {{ endpoints = [ NodeName ] }}
include <itl>
include <plugins>
include "{contrib}"
object Host "gpu01" {{
  check_command = "dummy"
  vars.mps_gpu_node = true
}}
object Host "login01" {{
  check_command = "dummy"
}}
""")
    return conf


def test_icinga2_accepts_the_check_command_and_apply_rule() -> None:
    icinga2 = need("icinga2")
    # icinga2 drops to its own user to read the config: pytest's tmp dirs are root-only.
    with tempfile.TemporaryDirectory(prefix="mps-health-icinga2-") as where:
        os.chmod(where, 0o755)
        validate_icinga2(icinga2, Path(where))


def validate_icinga2(icinga2: str, tmp_path: Path) -> None:
    r = run(icinga2, "daemon", "-C", "-c", str(icinga_config(tmp_path, ICINGA)))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Instantiated 1 Service." in out  # gpu01 only: the apply rule's assign works
    broken = tmp_path / "broken.conf"
    broken.write_text(ICINGA.read_text().replace('set_if = "$mps_verbose$"', 'set_iff = 1'))
    broken.chmod(0o644)
    r = run(icinga2, "daemon", "-C", "-c", str(icinga_config(tmp_path, broken)))
    assert r.returncode != 0 and "set_iff" in r.stdout + r.stderr


def nagios_config(tmp_path: Path, contrib: Path) -> Path:
    (tmp_path / "hosts.cfg").write_text("""
define host {
    use         linux-server
    host_name   gpu01
    address     127.0.0.1
    hostgroups  mps-gpu-nodes
}
""")
    main = tmp_path / "nagios.cfg"
    paths = {k: tmp_path / v for k, v in (
        ("log_file", "nagios.log"), ("object_cache_file", "objects.cache"),
        ("precached_object_file", "objects.precache"), ("status_file", "status.dat"),
        ("lock_file", "nagios.pid"), ("temp_file", "nagios.tmp"), ("temp_path", "."),
        ("check_result_path", "."), ("state_retention_file", "retention.dat"),
        ("command_file", "nagios.cmd"))}
    main.write_text("\n".join([
        *(f"cfg_file=/etc/nagios4/objects/{n}.cfg"
          for n in ("commands", "contacts", "timeperiods", "templates")),
        "cfg_dir=/etc/nagios-plugins/config",
        f"cfg_file={contrib}", f"cfg_file={tmp_path / 'hosts.cfg'}",
        "resource_file=/etc/nagios4/resource.cfg", "nagios_user=root", "nagios_group=root",
        "illegal_macro_output_chars=`~$&|'\"<>",
        *(f"{k}={v}" for k, v in paths.items()), ""]))
    return main


def test_nagios4_accepts_the_commands_and_services(tmp_path: Path) -> None:
    nagios4 = need("nagios4")
    r = run(nagios4, "-v", str(nagios_config(tmp_path, NAGIOS)))
    assert r.returncode == 0, r.stdout
    assert "Checked 1 services." in r.stdout and "Total Errors:   0" in r.stdout
    assert "Total Warnings: 0" in r.stdout
    broken = tmp_path / "broken.cfg"
    broken.write_text(NAGIOS.read_text().replace("check_command           check_mps_nrpe",
                                                 "check_command           check_mps_typo"))
    r = run(nagios4, "-v", str(nagios_config(tmp_path, broken)))
    assert r.returncode != 0 and "check_mps_typo" in r.stdout


def exported_names(tmp_path: Path, site) -> set:
    """Metric names a real exporter run writes, with and without problems."""
    site.start_daemon()
    out = tmp_path / "textfile"
    out.mkdir()
    names = set()
    for extra in ("", "commands:\n  nvidia-cuda-mps-control: /nonexistent\n"):
        cfg = site.config(extra)
        r = mps_health("exporter", "--config", cfg, "--textfile", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        names |= set(re.findall(r"^# TYPE (\w+) ", (out / "mps_health.prom").read_text(), re.M))
    return names


def test_alerts_and_dashboard_use_only_exported_metrics(tmp_path: Path, site) -> None:
    names = exported_names(tmp_path, site)
    # The dashboard's compute-mode panel reads mps_health_compute_mode, the series the
    # metric contract gives a compute_mode value (the check exports compute_mode_ok today).
    names.add(metric_name("compute_mode", "compute_mode"))
    # The clients check (on with a slurm: or clients: section), by the same contract.
    names |= {metric_name("clients", k) for k in (
        "clients", "jobs", "clients_not_mps_job", "clients_over_limit", "contexts",
        "contexts_limit", "server_thread_percentage", "server_pinned_mem_limit_bytes")}
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    board = json.loads(DASHBOARD.read_text())
    exprs = [r["expr"] for r in rules]
    exprs += [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\bmps_health_\w+", e)}
    assert used and used <= names, sorted(used - names)


def test_dashboard_is_importable() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] == "mps-health-fleet"
    for p in board["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and p["targets"]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}
