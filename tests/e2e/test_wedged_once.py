"""A stopped control daemon with a server costs every command one timeout: the servers
are not asked once the run's control query got no answer (and say why), the daemon is
not "up", and a terminal is told what the run waits for. No timings here: what was
waited for is asserted; bench/wedged_instances.py measures the time."""

import json
import re
import signal
from pathlib import Path
from typing import Tuple

from clirun import check_mps, mps_health, results
from monitoring_tools import metric_lines
from plugin_output import parse
from ptyrun import stderr_on_pty

NOT_ASKED = ("not asked: the control daemon gave no answer to "
             "get_default_active_thread_percentage this run (no answer within ")


def _with_server(site, timeout: float = 1.0) -> Tuple[object, str]:
    d = site.start_daemon()
    cfg = site.config(f"control:\n  timeout_s: {timeout}\n")
    started = d.query("fake_server_start")
    assert started.returncode == 0, started.stdout + started.stderr
    return d, cfg


def _stopped(d, run):  # type: ignore[no-untyped-def]
    d.signal(signal.SIGSTOP)
    try:
        return run()
    finally:
        d.signal(signal.SIGCONT)


def test_check_does_not_ask_a_stopped_daemon_for_its_servers(site) -> None:
    d, cfg = _with_server(site)
    r = _stopped(d, lambda: mps_health("check", "--config", cfg, "--format", "json"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert [x["code"] for x in results(r, "control")] == ["control-wedged"]
    (servers,) = results(r, "servers")
    assert servers["code"] == "servers-not-asked"
    assert servers["message"].startswith(f"cannot list the servers (skipped: {NOT_ASKED}")
    (stopped,) = [x for x in results(r, "daemon") if x["instance"] == "node"]
    assert stopped["code"] == "daemon-stopped" and stopped["values"]["daemon_up"] == 0
    assert "waiting" not in r.stderr  # not a terminal: nothing but the documented output


def test_clients_does_not_ask_a_stopped_daemon_for_its_servers(site) -> None:
    d, cfg = _with_server(site)
    r = _stopped(d, lambda: mps_health("clients", "--config", cfg, "--format", "json"))
    assert r.returncode == 3, r.stdout + r.stderr
    (inst,) = json.loads(r.stdout)["instances"]
    assert inst["query"] == "skipped" and inst["detail"].startswith(NOT_ASKED)


def test_check_mps_names_codes_and_gives_daemon_up_0(site) -> None:
    d, cfg = _with_server(site)
    r = _stopped(d, lambda: check_mps("--config", cfg, "-t", "5", "-c", "0.5", "-v"))
    out = parse(r.stdout, r.returncode)
    print(r.stdout)
    assert (r.returncode, out.state) == (2, "CRITICAL")
    # The servers that could not be listed follow from the stopped daemon: folded under it.
    assert "daemon-stopped node" in out.text and "servers-not-asked node" not in out.text
    assert "node_latency" not in out.text
    assert any(line.startswith("CRITICAL control-slow node: latency ")
               for line in out.long_lines), out.long_lines
    assert out.perf("node_daemon_up").value == "0"
    assert any(line.startswith("FOLDED servers[node] servers-not-asked: cannot list the "
                               f"servers (skipped: {NOT_ASKED}") for line in out.long_lines)


def test_exporter_counts_a_stopped_daemon_as_down(tmp_path: Path, site) -> None:
    d, cfg = _with_server(site)
    out = tmp_path / "textfile"
    out.mkdir()
    r = _stopped(d, lambda: mps_health("exporter", "--config", cfg, "--textfile", str(out)))
    assert r.returncode == 0, r.stderr
    text = (out / "mps_health.prom").read_text()
    assert metric_lines(text, "mps_health_daemon_up") == [
        'mps_health_daemon_up{mps_instance="node"} 0.0']
    # One cause, one alert: the servers it could not list are folded under it.
    assert 'code="servers-not-asked"' not in text
    assert 'mps_health_problems{check="daemon",code="daemon-stopped"' in text


def test_a_terminal_is_told_what_the_run_waits_for(site) -> None:
    d = site.start_daemon()
    cfg = site.config("control:\n  timeout_s: 3.0\n")  # room past the second, under load
    rc, said = _stopped(d, lambda: stderr_on_pty("check", "--config", cfg, "--only", "control"))
    assert rc == 2, said
    assert re.search(r"mps-health: waiting for the control daemon of node \(up to (3|2\.9)s\)"
                     r"\.\.\.\r?\n", said), said
    assert said.count("waiting for") == 1


def test_healthcheck_does_not_ask_a_stopped_daemon_for_its_servers(site) -> None:
    d, cfg = _with_server(site)
    r = _stopped(d, lambda: mps_health("healthcheck", "--foreground", "--dry-run",
                                       "--config", cfg))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "daemon-stopped" in r.stdout and "servers-not-asked" not in r.stdout, r.stdout
    assert "failed run 1 of 2" in r.stdout
