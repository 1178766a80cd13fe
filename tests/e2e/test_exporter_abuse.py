"""The served exporter under abuse by an unprivileged local user, on real localhost sockets:
a flood of held-open connections above the cap, slowloris, a client that never reads.
Scrapes are still answered, check runs during the attack still judge, each abusive
connection is closed after its deadline, and stderr stays a few counted lines.

Timings are pass/fail only as generous deadlines that tell "answered" from "hung"."""

import contextlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest
from clirun import argv
from hostile import ATTACKER, as_user
from monitoring_tools import get, metric_lines, started, wait_for
from paths import HELPERS, REPO

CLIENTS = str(HELPERS / "abuse_clients.py")
PYTHON = "/usr/bin/python3"  # the attacker's own python: the test's may be in root's home


def attacker(*args: str) -> List[str]:
    return [PYTHON, CLIENTS, *args]


def run_attack(*args: str, timeout: float = 120) -> dict:
    r = subprocess.run(attacker(*args), capture_output=True, text=True, timeout=timeout,
                       **as_user(ATTACKER))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@contextlib.contextmanager
def served(tmp_path: Path, config: str, *args: str, wrap: Tuple[str, ...] = ()
           ) -> Iterator[Tuple[str, int, Path, subprocess.Popen]]:
    """The exporter on a free localhost port (run under ``wrap``, e.g. prlimit):
    (base URL, port, its log, its process)."""
    log = tmp_path / "exporter.log"
    command = [*wrap, *argv("mps-health", "exporter", "--config", config,
                            "--listen", "127.0.0.1:0", "--interval", "1", *args)]
    with started(command, log) as proc:
        def announced() -> "str | None":
            if proc.poll() is not None:
                pytest.fail(f"exporter exited {proc.returncode}: {log.read_text()}")
            for line in log.read_text().splitlines():
                if "serving http://" in line:
                    return line.split("serving ", 1)[1].split("/metrics", 1)[0]
            return None

        url = wait_for("the exporter to listen", announced)
        yield url, int(url.rsplit(":", 1)[1]), log, proc


def runs_judged(body: str) -> Tuple[float, str, str]:
    """(last run time, status line, run_success line) of one scrape."""
    return (float(metric_lines(body, "mps_health_last_run_timestamp_seconds")[0].split()[1]),
            metric_lines(body, "mps_health_status")[0],
            metric_lines(body, "mps_health_run_success")[0])


def test_flood_above_the_cap_leaves_scrapes_and_checks_working(tmp_path: Path,
                                                              site) -> None:
    """1100 held-open connections against an open-file limit of 400 (the checks once
    failed with EMFILE and every scrape timed out): the cap is lowered to fit the limit,
    scrapes are answered, a Prometheus-style kept-alive connection survives, and the runs
    during the flood judge the node as before it."""
    import http.client

    site.start_daemon()
    # The control check spawns the client (a pipe per run: the EMFILE seen), and its
    # deadline and latency warning are generous: the flood loads a shared two-core machine.
    cfg = site.config("control:\n  timeout_s: 20\n  warn_latency_s: 15\n"
                      "exporter:\n  max_connections: 1000\n  header_timeout_s: 2\n")
    with served(tmp_path, cfg, "--only", "control,directories", "--budget", "30",
                wrap=("prlimit", "--nofile=400:400")) as (url, port, log, _proc):
        start_line = log.read_text().splitlines()[0]
        assert "not exporter.max_connections 1000: the open-file limit 400 keeps 256 " \
               "for the checks" in start_line, start_line
        before = wait_for("a first run", lambda: (lambda b: b if "mps_health_status" in b
                                                  else None)(get(url + "/metrics")[2]))
        _, status, success = runs_judged(before)
        assert (status, success) == ("mps_health_status 0.0", "mps_health_run_success 1.0"), \
            metric_lines(before, "mps_health_problems")
        prometheus = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        prometheus.request("GET", "/metrics")
        assert prometheus.getresponse().read()

        flood = subprocess.Popen(attacker("flood", str(port), "1100", "60"),
                                 stdout=subprocess.PIPE, text=True, **as_user(ATTACKER))
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "ready\n"
            flood_began = time.time()
            seen = []
            while len(seen) < 4:  # runs that ended during the flood
                status_code, _, body = get(url + "/metrics", timeout=30)
                assert status_code == 200
                ran_at, status, success = runs_judged(body)
                if ran_at > flood_began and ran_at not in [s[0] for s in seen]:
                    seen.append((ran_at, status, success))
                time.sleep(0.3)
            prometheus.request("GET", "/metrics")  # the kept-alive scraper is still served
            assert prometheus.getresponse().status == 200
        finally:
            flood.kill()
            flood.wait(10)
        assert [(s, ok) for _, s, ok in seen] == [(status, success)] * 4, \
            metric_lines(body, "mps_health_problems")
        assert 'mps_health_check_success{check="control"} 1.0' in body
        time.sleep(0.6)  # the server's series are rebuilt twice a second
        after = get(url + "/metrics")[2]
        cap = int(float(metric_lines(after, "mps_health_exporter_max_connections")[0].split()[1]))
        assert 0 < cap < 400 - 256
        over = metric_lines(after, 'mps_health_exporter_connections_closed_total{reason="over_cap"}')
        # Closed over the cap: how many depends on how fast the server accepted (the
        # kernel holds the rest of the flood in its queues), so at least one.
        assert len(over) == 1 and float(over[0].split()[1]) >= 1
    text = log.read_text()
    print(text)
    assert "Traceback" not in text and "Too many open files" not in text
    lines = text.splitlines()
    assert len(lines) <= 6 and len(text) < 2000  # counted lines, not one per connection
    assert any("connections over the cap of" in line for line in lines)


def test_slowloris_is_closed_after_the_header_deadline(tmp_path: Path, site) -> None:
    site.dirs()
    cfg = site.config("exporter:\n  header_timeout_s: 1\n"
                      "  idle_timeout_s: 3600\n")
    with served(tmp_path, cfg) as (url, port, log, _proc):
        seen = run_attack("slowloris", str(port), "0.2", "60")
        assert seen["closed_after_s"] is not None, "a slowloris client was held for 60 s"
        assert get(url + "/metrics")[0] == 200
    assert "sent no whole request within header_timeout_s 1" in log.read_text()


def test_client_that_never_reads_is_dropped_after_the_write_deadline(tmp_path: Path,
                                                                     site) -> None:
    site.dirs()
    cfg = site.config("exporter:\n  write_timeout_s: 1\n"
                      "  idle_timeout_s: 3600\n  header_timeout_s: 300\n")
    with served(tmp_path, cfg) as (url, port, log, _proc):
        seen = run_attack("nonreader", str(port), "60")
        assert seen["dropped_after_s"] is not None, "a client that never reads was held 60 s"
        assert seen["requests"] > 1
        assert get(url + "/metrics")[0] == 200
    assert "took no response within write_timeout_s 1" in log.read_text()


def test_idle_kept_alive_connection_is_closed_after_the_idle_timeout(tmp_path: Path,
                                                                     site) -> None:
    """Quietly: an idle connection is normal (Prometheus between scrapes), not abuse."""
    import socket

    site.dirs()
    cfg = site.config("exporter:\n  idle_timeout_s: 1\n")
    with served(tmp_path, cfg) as (_url, port, log, _proc):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):  # b"" once the server closes: not a 30 s timeout
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"keep-alive" in reply
        assert reply.endswith(b"</html>\n")
    assert len(log.read_text().splitlines()) == 1  # the start line only


def test_oversized_request_head_is_refused_and_closed(tmp_path: Path, site) -> None:
    import socket

    site.dirs()
    with served(tmp_path, site.config()) as (url, port, _log, _proc):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /" + b"a" * 20000)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert get(url + "/metrics")[0] == 200


def test_all_three_attacks_at_once_log_a_few_counted_lines(tmp_path: Path, site) -> None:
    site.dirs()
    cfg = site.config("exporter:\n  max_connections: 64\n"
                      "  header_timeout_s: 0.5\n  write_timeout_s: 0.5\n")
    with served(tmp_path, cfg) as (url, port, log, proc):
        attacks = [subprocess.Popen(attacker(*a), stdout=subprocess.DEVNULL,
                                    **as_user(ATTACKER))
                   for a in (("flood", str(port), "300", "8"),
                             *[("slowloris", str(port), "0.1", "8")] * 20,
                             *[("nonreader", str(port), "8")] * 5)]
        try:
            for _ in range(10):
                assert get(url + "/metrics", timeout=30)[0] == 200
                time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)  # stops cleanly with the attack going on
            assert proc.wait(30) == 0
        finally:
            for a in attacks:
                a.wait(60)
    text = log.read_text()
    print(text)
    assert "Traceback" not in text
    # The start line, then per kind (over the cap, header, write) its first event at once
    # and the count of the rest when the server stops: hundreds of events, seven lines.
    assert len(text.splitlines()) <= 7 and len(text) < 2000
    assert sum(int(n) for n in re.findall(r"\((\d+) in the last", text)) > 100


def test_unit_open_file_limit_fits_the_default_cap_and_the_reserve() -> None:
    """The unit's LimitNOFILE (systemd-analyze verify checks its syntax, with the other
    units, in tests/fleet/test_fleet_contrib.py) leaves the default cap whole."""
    from mps_health.config.exporter import ExporterConfig
    from mps_health.exporters.fdbudget import RESERVE_FDS

    unit = (REPO / "contrib/systemd/mps-health-exporter.service").read_text()
    limits = [line.split("=", 1)[1] for line in unit.splitlines()
              if line.startswith("LimitNOFILE=")]
    assert len(limits) == 1
    # 64 for the interpreter, NVML and the listening socket, with room to spare
    assert int(limits[0]) >= ExporterConfig().max_connections + 1 + RESERVE_FDS + 64


def test_no_room_for_connections_and_bad_limits_are_one_line_unknown(tmp_path: Path,
                                                                     site) -> None:
    from clirun import mps_health

    site.dirs()
    cfg = site.config()
    r = subprocess.run(["prlimit", "--nofile=200:200",
                        *argv("mps-health", "exporter", "--config", cfg,
                              "--listen", "127.0.0.1:0")],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == ("mps-health: the open-file limit (200) leaves no room for connections "
                        "after 256 kept for the checks: raise it (LimitNOFILE= in the unit, "
                        "ulimit -n)\n")
    bad = site.config("exporter:\n  max_connections: 0\n", file="bad.yaml")
    r = mps_health("exporter", "--config", bad)
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"mps-health: {bad}: key 'exporter.max_connections': must be a whole "
                        "number from 1 to 100000 (got 0)\n")


def test_a_low_soft_limit_is_raised_toward_the_hard_one(tmp_path: Path, site) -> None:
    """systemd's default soft limit (1024) or a shell's lower one costs no connections
    while the hard limit has room: the soft one is raised to what the cap needs."""
    site.dirs()
    cfg = site.config("exporter:\n  max_connections: 500\n")
    with served(tmp_path, cfg, wrap=("prlimit", "--nofile=300:4096")) as (url, _p, log, proc):
        assert "at most" not in log.read_text()
        body = get(url + "/metrics")[2]
        assert metric_lines(body, "mps_health_exporter_max_connections") == [
            "mps_health_exporter_max_connections 500.0"]
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = [line.split()[3] for line in limits.splitlines()
                if line.startswith("Max open files")]
        assert 500 + 256 < int(soft[0]) <= 4096


def proc_status(pid: int) -> Tuple[int, int]:
    """(resident bytes, threads) of a process now."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"])


def test_held_open_connections_cost_a_thread_each_and_little_memory(tmp_path: Path,
                                                                    site) -> None:
    """A thread per connection: 100 held open are 100 threads, yet a scrape is answered
    at once, and they cost little resident memory (stacks are only what is touched)."""
    site.dirs()
    cfg = site.config("exporter:\n  max_connections: 200\n  header_timeout_s: 120\n")
    # One malloc arena: glibc's per-thread arenas would blur what the threads cost. One
    # run, then none (the last --interval is taken): no run's threads come and go while
    # the connections' are counted, however long a loaded machine makes a run.
    with served(tmp_path, cfg, "--only", "directories", "--interval", "3600",
                wrap=("env", "MALLOC_ARENA_MAX=1")) as (url, _port, log, proc):
        wait_for("the first run", lambda: "mps_health_status" in get(url + "/metrics")[2])
        rss_before = proc_status(proc.pid)[0]
        flood = subprocess.Popen(attacker("flood", str(_port), "100", "60"),
                                 stdout=subprocess.PIPE, text=True, **as_user(ATTACKER))
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "ready\n"
            wait_for("the held-open connections accepted", lambda: held(url) >= 100)
            rss, threads = proc_status(proc.pid)
            assert get(url + "/metrics", timeout=30)[0] == 200
        finally:
            flood.kill()
            flood.wait(10)
        # Their threads end with them: counted by what goes, so no other thread that
        # comes or goes meanwhile (the first run's, on a loaded machine) is taken for one.
        wait_for("the connections' threads to end",
                 lambda: held(url) <= 1 and threads - proc_status(proc.pid)[1] >= 100)
        ended = threads - proc_status(proc.pid)[1]
        print(f"{ended} threads ended with the connections; {(rss - rss_before) >> 10} KiB "
              "more resident with them")
        assert ended <= 200
        assert rss - rss_before < 100 * (256 << 10)
    assert "Traceback" not in log.read_text()


def held(url: str) -> float:
    """The client connections the exporter has open (its own gauge; this scrape's
    among them)."""
    return float(metric_lines(get(url + "/metrics")[2],
                              "mps_health_exporter_connections")[0].split()[1])


class KeptAlive:
    """A scraper as Prometheus is one: one connection kept alive between scrapes; when
    the server has closed it, a new one and the request once more (Go's HTTP client)."""

    def __init__(self, port: int, timeout: float) -> None:
        import http.client

        self.new = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn = self.new()
        self.retried = 0

    def scrape(self) -> int:
        import http.client

        try:
            return self.once()
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
            self.retried += 1
            self.conn.close()
            self.conn = self.new()
            return self.once()

    def once(self) -> int:
        self.conn.request("GET", "/metrics")
        r = self.conn.getresponse()
        r.read()
        return r.status


def scrapes_answered(scrape: Callable[[], int], asked: int, gap: float) -> List[str]:
    """Ask ``asked`` times, ``gap`` s apart: what each got ("200", "timeout" where no
    answer came in time, or the error's name: the server closed it)."""
    import socket
    import urllib.error

    got = []
    for _ in range(asked):
        time.sleep(gap)
        try:
            got.append(str(scrape()))
        except Exception as e:  # a failed scrape is a result here, counted
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            got.append("timeout" if isinstance(reason, socket.timeout) else type(e).__name__)
    return got


def test_talk_flood_and_connect_flood_leave_every_scrape_answered(tmp_path: Path,
                                                                 site) -> None:
    """The cap full of one user's connections that ask again as soon as they are answered,
    reconnecting when closed, and a flood of held-open connections on top: a kept-alive
    scraper (Prometheus) gets every answer, a new-connection one (curl) is never closed
    by the server, and the threads stay at the cap. (Before, the new scraper's
    connection, the only one without a request, was closed first, and the kept-alive
    one, the least recently active.) A new connection waits in the kernel's accept queue
    behind the flood's: on a loaded machine it may time out there, which is the
    machine's speed, not the order (bench/exporter_abuse.py counts the answers)."""
    import threading

    site.dirs()
    cfg = site.config("exporter:\n  max_connections: 32\n")
    asked = 10
    with served(tmp_path, cfg, "--only", "directories") as (url, port, log, proc):
        assert get(url + "/metrics")[0] == 200
        keep = KeptAlive(port, timeout=10)
        assert keep.scrape() == 200
        talk = subprocess.Popen(attacker("talker", str(port), "32", "120"),
                                stdout=subprocess.PIPE, text=True, **as_user(ATTACKER))
        flood = subprocess.Popen(attacker("flood", str(port), "300", "120"),
                                 stdout=subprocess.DEVNULL, **as_user(ATTACKER))
        try:
            assert talk.stdout is not None and talk.stdout.readline() == "ready\n"
            results: dict = {}
            scrapers = [
                threading.Thread(target=lambda: results.update(
                    kept=scrapes_answered(keep.scrape, asked, 1.0))),
                threading.Thread(target=lambda: results.update(
                    new=scrapes_answered(lambda: get(url + "/metrics", timeout=10)[0],
                                         asked, 1.0)))]
            for t in scrapers:
                t.start()
            threads = 0
            while any(t.is_alive() for t in scrapers):
                threads = max(threads, proc_status(proc.pid)[1])
                time.sleep(0.2)
            for t in scrapers:
                t.join()
        finally:
            for p in (talk, flood):
                p.kill()
                p.wait(10)
        print(f"kept-alive: {results['kept']} (retried {keep.retried}); "
              f"new connection: {results['new']}; at most {threads} threads")
        assert results["kept"] == ["200"] * asked
        assert set(results["new"]) <= {"200", "timeout"}, results["new"]
        assert threads <= 32 + 8  # the cap, the checks, the stopper: bounded
    text = log.read_text()
    assert "Traceback" not in text and "those without a request, then the most " \
        "demanding, first" in text
