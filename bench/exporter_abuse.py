#!/usr/bin/env python3
"""Scrape latency of the served exporter with and without an attack, in one run, as ratios.

Two normal scrapers ask for /metrics every --gap seconds: one on a kept-alive connection,
reconnecting and retrying once when a reused connection fails (as Prometheus' Go client
does), one on a new connection per scrape (curl, a restarted Prometheus). Each gives p50
and p99 latency and its failures (a scrape that gets no answer within 10 s, Prometheus'
default scrape timeout, or an error) first with no attack, then during one made of:
--flood connections held open without a byte (re-opened as the server closes them),
--slowloris clients dripping a header byte every 0.2 s, and --nonreaders clients that
pipeline requests and never read. Then a talk flood: --talkers connections (the cap, 64)
that each ask again as soon as they are answered, re-opened as the server closes them,
with the --flood of held-open connections on top, while the same two scrapers ask
--talk-scrapes times, --talk-gap seconds apart, as Prometheus does (kept-alive) and as a
new client does (a new connection each); it prints answered/asked for each. The exporter
runs with the config's defaults under an open-file limit of --nofile (1024: systemd's
default soft limit) and only the cheap ``directories`` check, so the figures are the HTTP
side's. Its stderr is counted too.

Usage: python3 bench/exporter_abuse.py [--scrapes N] [--gap S] [--flood N] [--python PY]
PY must have mps-health installed (default: this python).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
CLIENTS = REPO / "tests" / "helpers" / "abuse_clients.py"

# The normal scraper: its own process, so its GIL never slows the server under test.
SCRAPER = r"""
import http.client, json, sys, time
port, n, gap, fresh = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
lat, failed, retried = [], [], 0
conn = None
def once(conn):
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200 and b"mps_health_build_info" in body, r.status
for _ in range(n):
    t0 = time.perf_counter()
    try:
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            once(conn)
        else:
            try:
                once(conn)
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                retried += 1  # a kept-alive connection the server closed: retry once
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                once(conn)
        lat.append(time.perf_counter() - t0)
    except Exception as e:
        failed.append(type(e).__name__)
        conn.close()
        conn = None
    time.sleep(gap)
print(json.dumps({"lat": lat, "failed": failed, "retried": retried}))
"""


def percentile(values: List[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def start_exporter(python: str, work: Path, nofile: int) -> Tuple[subprocess.Popen, int, Path]:
    for d in ("pipe", "log"):
        (work / d).mkdir()
    config = work / "config.yaml"
    config.write_text(f"run_dir: {work}/run\nstate_dir: {work}/state\n"
                      f"mps:\n  pipe_dir: {work}/pipe\n  log_dir: {work}/log\n")
    log = work / "exporter.log"
    argv = ["prlimit", f"--nofile={nofile}:{nofile}", python, "-m",
            "mps_health.cli.main", "exporter", "--config", str(config), "--listen",
            "127.0.0.1:0", "--interval", "2", "--only", "directories"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "serving http://" in line:
                port = int(line.split("serving http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
                return proc, port, log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"exporter_abuse: the exporter did not start: {log.read_text()}")


def status(pid: int) -> Tuple[int, int]:
    """The exporter's resident memory (KiB) and threads now."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def scrape(port: int, n: int, gap: float, pid: int) -> Tuple[Dict[str, dict], Tuple[int, int]]:
    """Both scrapers at once: their results by name, and the exporter's largest resident
    memory (KiB) and thread count seen meanwhile."""
    procs = {name: subprocess.Popen([sys.executable, "-c", SCRAPER, str(port), str(n), str(gap),
                                     fresh], stdout=subprocess.PIPE, text=True)
             for name, fresh in (("kept-alive", "0"), ("new connection", "1"))}
    peak = status(pid)
    while any(p.poll() is None for p in procs.values()):
        now = status(pid)
        peak = (max(peak[0], now[0]), max(peak[1], now[1]))
        time.sleep(0.1)
    return {name: json.loads(p.communicate(timeout=n * (gap + 11) + 60)[0])
            for name, p in procs.items()}, peak


def scrape_under(attackers: List[subprocess.Popen], port: int, n: int, gap: float,
                 pid: int) -> Tuple[Dict[str, dict], Tuple[int, int]]:
    """``scrape`` while the attackers run, then end them (whatever the scrape did)."""
    try:
        time.sleep(3)  # the attackers' interpreters have started
        return scrape(port, n, gap, pid)
    finally:
        for a in attackers:
            a.terminate()
        for a in attackers:
            a.wait(30)


def talk_flood(port: int, talkers: int, flood: int, seconds: float) -> List[subprocess.Popen]:
    """The cap full of connections that keep asking, then a flood of held-open ones."""
    client = [sys.executable, str(CLIENTS)]
    procs = [subprocess.Popen([*client, "talker", str(port), str(talkers), str(seconds)],
                              stdout=subprocess.PIPE, text=True)]
    assert procs[0].stdout is not None
    procs[0].stdout.readline()  # "ready": they are being answered
    procs.append(subprocess.Popen([*client, "flood", str(port), str(flood), str(seconds)],
                                  stdout=subprocess.PIPE, text=True))
    return procs


def attack(port: int, flood: int, slowloris: int, nonreaders: int, seconds: float
           ) -> List[subprocess.Popen]:
    client = [sys.executable, str(CLIENTS)]
    procs = [subprocess.Popen([*client, "flood", str(port), str(flood), str(seconds)],
                              stdout=subprocess.PIPE, text=True)]
    procs += [subprocess.Popen([*client, "slowloris", str(port), "0.2", str(seconds)],
                               stdout=subprocess.DEVNULL) for _ in range(slowloris)]
    procs += [subprocess.Popen([*client, "nonreader", str(port), str(seconds)],
                               stdout=subprocess.DEVNULL) for _ in range(nonreaders)]
    assert procs[0].stdout is not None
    procs[0].stdout.readline()  # "ready": the flood holds its connections
    return procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--flood", type=int, default=1100)
    ap.add_argument("--slowloris", type=int, default=50)
    ap.add_argument("--nonreaders", type=int, default=10)
    ap.add_argument("--talkers", type=int, default=64)
    ap.add_argument("--talk-scrapes", type=int, default=24)
    ap.add_argument("--talk-gap", type=float, default=1.0)
    ap.add_argument("--nofile", type=int, default=1024)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    if shutil.which("prlimit") is None:
        sys.exit("exporter_abuse: needs prlimit (util-linux)")
    work = Path(tempfile.mkdtemp(prefix="mpsh-abuse-"))
    proc, port, log = start_exporter(args.python, work, args.nofile)
    try:
        time.sleep(1)
        base, base_peak = scrape(port, args.scrapes, args.gap, proc.pid)
        seconds = args.scrapes * (args.gap + 0.05) + 120  # outlasts the scrapes; ended below
        attackers = attack(port, args.flood, args.slowloris, args.nonreaders, seconds)
        during, attack_peak = scrape_under(attackers, port, args.scrapes, args.gap, proc.pid)
        seconds = args.talk_scrapes * (args.talk_gap + 11) + 60
        attackers = talk_flood(port, args.talkers, args.flood, seconds)
        talk, talk_peak = scrape_under(attackers, port, args.talk_scrapes, args.talk_gap,
                                       proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    print(f"exporter: defaults (max_connections 64, header/write 10 s), open-file limit "
          f"{args.nofile}; attack: {args.flood} held-open connections, {args.slowloris} "
          f"slowloris, {args.nonreaders} non-readers; {args.scrapes} scrapes per scraper "
          f"and phase, {args.gap:g} s apart; {os.cpu_count()} CPUs")
    print(f"{'scraper':16} {'phase':9} {'ok':>5} {'failed':>6} {'retried':>7} "
          f"{'p50 ms':>8} {'p99 ms':>8}")
    for name in base:
        rows = {}
        for phase, res in (("no attack", base[name]), ("attack", during[name])):
            lat = res["lat"]
            p50 = statistics.median(lat) * 1000 if lat else float("nan")
            p99 = percentile(lat, 99) * 1000 if lat else float("nan")
            rows[phase] = (p50, p99)
            print(f"{name:16} {phase:9} {len(lat):5d} {len(res['failed']):6d} "
                  f"{res['retried']:7d} {p50:8.2f} {p99:8.2f}")
        (b50, b99), (a50, a99) = rows["no attack"], rows["attack"]
        print(f"{name:16} ratio attack/no attack: p50 {a50 / b50:.2f}x, p99 {a99 / b99:.2f}x")
    print(f"talk flood: {args.talkers} connections asking without pause, {args.flood} "
          f"held-open on top; {args.talk_scrapes} scrapes per scraper, {args.talk_gap:g} s apart")
    for name, res in talk.items():
        print(f"{name:16} talk flood: answered {len(res['lat'])}/{args.talk_scrapes}, "
              f"retried {res['retried']}, failed {res['failed']}")
    for phase, (rss, threads) in (("no attack", base_peak), ("attack", attack_peak),
                                  ("talk flood", talk_peak)):
        print(f"exporter, {phase}: at most {rss / 1024:.1f} MiB resident, {threads} threads")
    lines = text.splitlines()
    print(f"exporter stderr: {len(lines)} lines, {len(text.encode())} bytes, "
          f"tracebacks: {text.count('Traceback')}")
    for line in lines[1:]:
        print(f"  {line}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
