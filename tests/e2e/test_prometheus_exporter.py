"""``mps-health exporter``: served and textfile output against fake daemons, checked by
promtool; scrapes answered from the cache while a wedged daemon holds a run."""

import signal
import subprocess
import time
from pathlib import Path

from clirun import mps_health
from monitoring_tools import exporter, get, metric_lines, need, wait_for


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([need("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60)


def test_textfile_is_valid_and_has_no_process_series(tmp_path: Path, site) -> None:
    site.start_daemon()
    cfg = site.config()
    out = tmp_path / "textfile"
    out.mkdir()
    r = mps_health("exporter", "--config", cfg, "--textfile", str(out))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mps_health.prom"]  # no temp file left
    text = (out / "mps_health.prom").read_text()
    print(text)
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not [line for line in text.splitlines() if line.startswith(("process_", "python_"))]
    assert metric_lines(text, "mps_health_daemon_up") == [
        'mps_health_daemon_up{mps_instance="node"} 1.0']
    assert metric_lines(text, "mps_health_dir_ok") == ['mps_health_dir_ok{mps_instance="node"} 1.0']
    latency = metric_lines(text, "mps_health_control_latency_seconds")
    assert len(latency) == 1 and 0 < float(latency[0].split()[-1]) < 5
    assert 'mps_health_check_success{check="control"} 1.0' in text
    assert metric_lines(text, "mps_health_run_success") == ["mps_health_run_success 1.0"]
    assert metric_lines(text, "mps_health_build_info")[0].startswith("mps_health_build_info{")


def test_textfile_keeps_the_last_success_of_a_blind_run(tmp_path: Path, site) -> None:
    site.start_daemon()
    out = tmp_path / "textfile"
    out.mkdir()
    good = site.config()
    assert mps_health("exporter", "--config", good, "--textfile", str(out)).returncode == 0
    first = metric_lines((out / "mps_health.prom").read_text(),
                         "mps_health_last_success_timestamp_seconds")
    assert len(first) == 1
    blind = site.config(file="blind.yaml",
                        commands={"nvidia-cuda-mps-control": "/nonexistent/client"})
    time.sleep(0.05)
    assert mps_health("exporter", "--config", blind, "--textfile", str(out)).returncode == 0
    text = (out / "mps_health.prom").read_text()
    assert metric_lines(text, "mps_health_last_success_timestamp_seconds") == first
    assert metric_lines(text, "mps_health_run_success") == ["mps_health_run_success 0.0"]
    assert ('mps_health_problems{check="control",code="control-client-missing",'
            'mps_instance="node",state="unknown"} 1.0') in text
    assert 'mps_health_check_success{check="control"} 0.0' in text


def test_served_metrics_are_valid_with_process_series(tmp_path: Path, site) -> None:
    site.start_daemon()
    cfg = site.config()
    # An interval of 2 s fits the control query into 1.1 s: the fake daemon's Python
    # client, on a loaded machine, can take more than the 0.3 s an interval of 1 s leaves,
    # and a daemon that does not answer in time is not up (daemon_up 0).
    with exporter(tmp_path, cfg, "--interval", "2") as (proc, url):
        assert get(url + "/")[0] == 200 and get(url + "/nope")[0] == 404
        body = wait_for("a first run", lambda: (
            lambda b: b if "mps_health_last_run_timestamp_seconds" in b else None)(
                get(url + "/metrics")[2]))
        status, ctype, _ = get(url + "/metrics")
        assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
        checked = promtool_check(body)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert metric_lines(body, "process_resident_memory_bytes")
        assert metric_lines(body, "mps_health_daemon_up") == [
            'mps_health_daemon_up{mps_instance="node"} 1.0']
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_scrapes_do_not_wait_for_a_wedged_daemon(tmp_path: Path, site) -> None:
    """Each run waits out a long control timeout, back to back; every scrape meanwhile is
    answered within a deadline far shorter than what is left of the run it lands in (no
    timing asserted: a scrape that waited for the run would miss the deadline by seconds;
    bench/ measures how fast they are)."""
    d = site.start_daemon()
    cfg = site.config("control:\n  timeout_s: 8.0\n")
    d.signal(signal.SIGSTOP)
    try:
        with exporter(tmp_path, cfg, "--interval", "1", "--budget", "10",
                      "--only", "control") as (_proc, url):
            wedged = ('mps_health_problems{check="control",code="control-wedged",'
                      'mps_instance="node",state="critical"} 1.0')
            body = wait_for("the wedged verdict", lambda: (
                lambda b: b if wedged in b else None)(get(url + "/metrics")[2]), timeout=60)
            run_s = float(metric_lines(body, "mps_health_run_duration_seconds")[0].split()[1])
            assert run_s >= 8.0  # each run waits out the control timeout...
            # ...the next began at once (interval 1 s): the scrapes land in its first
            # seconds, while it waits on the daemon for seconds more.
            for _ in range(10):
                assert get(url + "/metrics", timeout=3)[0] == 200
    finally:
        d.signal(signal.SIGCONT)


def test_bad_exporter_settings_are_one_line_unknown(tmp_path: Path, site) -> None:
    bad = site.write("bad.yaml", "exporter:\n  interval_s: 0\n")
    r = mps_health("exporter", "--config", bad)
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"mps-health: {bad}: key 'exporter.interval_s': must be a number between "
                        "1 and 3600 (got 0)\n")
    unknown = site.write("unknown.yaml", "exporter:\n  port: 1\n")
    r = mps_health("exporter", "--config", unknown)
    assert r.returncode == 3 and "key 'exporter.port': unknown key" in r.stderr
    r = mps_health("exporter", "--listen", "nowhere")
    assert r.returncode == 3 and r.stderr.startswith("mps-health: listen address 'nowhere'")
    r = mps_health("exporter", "--textfile", str(tmp_path / "missing"))
    assert r.returncode == 3 and "no such directory" in r.stderr
    assert r.stderr.count("\n") == 1


def test_port_in_use_is_one_line_unknown(site) -> None:
    import socket

    site.dirs()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = mps_health("exporter", "--config", site.config(),
                       "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 3
    assert r.stderr == f"mps-health: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_http_keep_alive_head_and_bad_requests(tmp_path: Path, site) -> None:
    import http.client
    import socket

    site.dirs()
    cfg = site.config()
    with exporter(tmp_path, cfg, "--interval", "60", "--only", "directories") as (_p, url):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        bodies = []
        for _ in range(3):  # one connection, several scrapes: keep-alive as Prometheus does
            conn.request("GET", "/metrics?x=1")
            r = conn.getresponse()
            bodies.append(r.read())
            assert r.status == 200 and r.getheader("Connection") == "keep-alive"
        conn.request("HEAD", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"" and int(r.getheader("Content-Length")) > 0
        conn.request("POST", "/metrics", body=b"")
        assert conn.getresponse().status == 405
        conn.close()
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GARBAGE\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):  # the server answers, then closes
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert all(b"mps_health_build_info" in b for b in bodies)


def test_ipv6_listen_address(tmp_path: Path, site) -> None:
    """A bracketed IPv6 address binds an IPv6 socket (the server's family follows it)."""
    site.dirs()
    with exporter(tmp_path, site.config(), "--listen", "[::1]:0", "--interval", "60",
                  "--only", "directories") as (_proc, url):
        assert url.startswith("http://[::1]:")
        status, _, body = get(url + "/metrics")
        assert status == 200 and "mps_health_build_info" in body
