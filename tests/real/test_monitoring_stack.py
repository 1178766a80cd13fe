"""The real monitoring stack: Debian's Prometheus scrapes the exporter, evaluates our alert
rules and the dashboard's queries; node_exporter serves the textfile output.

Every server runs from a private temp dir on kernel-chosen free ports and is stopped by
its PID.
"""

import json
import re
import signal
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from clirun import mps_health
from conftest import REPO
from monitoring_tools import (
    exporter,
    free_port,
    get,
    metric_lines,
    need,
    node_wide_check,
    started,
    wait_for,
)

ALERTS = REPO / "contrib" / "prometheus" / "mps-health-alerts.yml"
DASHBOARD = REPO / "contrib" / "grafana" / "mps-health-dashboard.json"


def api(base: str, path: str, **params: str) -> Any:
    status, _, body = get(f"{base}{path}?{urllib.parse.urlencode(params)}")
    data = json.loads(body)
    assert status == 200 and data["status"] == "success", body
    return data["data"]


def dashboard_queries() -> List[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return exprs


def as_query(expr: str) -> str:
    """A dashboard expression with Grafana's variables set to 'all'."""
    expr = expr.replace("$job", ".*").replace("$instance", ".*")
    m = re.fullmatch(r"label_values\((.*), *(\w+)\)", expr)
    return f"count by ({m.group(2)}) ({m.group(1)})" if m else expr


@pytest.fixture
def prometheus(tmp_path: Path):
    """Start Prometheus scraping TARGET every second with our alert rules: (start, url)."""
    binary = need("prometheus")
    procs = []

    def start(target: str) -> str:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {ALERTS}
scrape_configs:
  - job_name: mps-health
    static_configs:
      - targets: ['{target}']
""")
        argv = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        ctx = started(argv, tmp_path / "prometheus.log")
        proc = ctx.__enter__()
        procs.append(ctx)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
            return get(url + "/-/ready", timeout=2)[0] == 200

        wait_for("prometheus to be ready", ready, timeout=60, every=0.2)
        return url

    yield start
    for ctx in procs:
        ctx.__exit__(None, None, None)


def first(alerts: List[Dict[str, Any]], **labels: str) -> Optional[Dict[str, Any]]:
    return next((a for a in alerts if all(a["labels"].get(k) == v for k, v in labels.items())),
                None)


def test_prometheus_scrapes_the_exporter_and_alerts(tmp_path: Path, site,
                                                    prometheus) -> None:
    d = site.start_daemon()
    cfg = site.config()
    with exporter(tmp_path, cfg, "--interval", "1", "--skip", node_wide_check()) as (_p, url):
        target = url.split("//", 1)[1]
        prom = prometheus(target)
        found = wait_for("a dir_ok series in Prometheus", lambda: api(
            prom, "/api/v1/query", query="mps_health_dir_ok")["result"])
        series = found[0]
        print(json.dumps(series))
        assert series["metric"] == {"__name__": "mps_health_dir_ok", "job": "mps-health",
                                    "instance": target, "mps_instance": "node"}
        assert series["value"][1] == "1"
        targets = api(prom, "/api/v1/targets")["activeTargets"]
        assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")]

        # The dashboard's queries run against real data, and the headline ones find it.
        for expr in dashboard_queries():
            result = api(prom, "/api/v1/query", query=as_query(expr))["result"]
            if "mps_health_build_info" in expr or "mps_health_control_latency" in expr:
                assert result, f"no data for dashboard query {expr}"

        # Every alert rule loads and evaluates without error.
        groups = wait_for("the rules to be evaluated", lambda: [
            g for g in api(prom, "/api/v1/rules")["groups"]
            if not any(r.get("lastEvaluation", "0001").startswith("0001") for r in g["rules"])])
        rules = groups[0]["rules"]
        assert len(rules) == 7 and all(r["health"] == "ok" for r in rules), rules

        # Kill the daemon: the next run's critical finding makes the alert pending (one
        # cause, one alert: its control-absent is folded under daemon-stale).
        d.signal(signal.SIGKILL)
        alert = wait_for("MpsHealthCritical to be pending", lambda: first(
            api(prom, "/api/v1/alerts")["alerts"], alertname="MpsHealthCritical",
            code="daemon-stale"), timeout=30)
        print(json.dumps(alert))
        assert alert["labels"]["instance"] == target and alert["state"] == "pending"
        assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#daemon-stale")


def test_node_exporter_serves_the_textfile(tmp_path: Path, site) -> None:
    binary = need("prometheus-node-exporter")
    site.start_daemon()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    r = mps_health("exporter", "--config", site.config(),
                   "--textfile", str(textfile))
    assert r.returncode == 0, r.stderr
    port = free_port()
    argv = [binary, "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={textfile}", f"--web.listen-address=127.0.0.1:{port}"]
    with started(argv, tmp_path / "node_exporter.log") as proc:
        def scraped() -> Optional[str]:
            if proc.poll() is not None:
                pytest.fail((tmp_path / "node_exporter.log").read_text())
            status, _, body = get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            return body if status == 200 else None

        body = wait_for("node_exporter to serve", scraped)
    assert metric_lines(body, "node_textfile_scrape_error") == ["node_textfile_scrape_error 0"]
    assert metric_lines(body, "mps_health_daemon_up") == [
        'mps_health_daemon_up{mps_instance="node"} 1']
    stamp = metric_lines(body, "mps_health_last_run_timestamp_seconds")
    assert len(stamp) == 1 and abs(float(stamp[0].split()[1]) - time.time()) < 120
