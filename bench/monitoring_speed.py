#!/usr/bin/env python3
"""Monitoring outputs against their baselines, in one run, printed as ratios.

* Scrapes: `mps-health exporter` (served from its cache) against node_exporter serving the
  same metrics from `mps-health exporter --textfile` (only its textfile collector on).
  16 scrapers at once, each on a keep-alive connection as Prometheus scrapes; median and
  p99 latency per target. The two targets take turns in rounds, so drift hits both.
  Goal: our p99 no worse than node_exporter's.
* Memory: the exporter's resident set (VmRSS) after the scrapes. Goal: under 60 MB.
* check_mps against `mps-health check` on the same node and checks: median wall time.

The daemon is tests/fakes' fake, built as an executable by tests/helpers/fakebin.py with its
client in C (launcher.c's FAST_CLIENT), as the real client is: otherwise the Python fake
client's start-up would dominate both check timings. Needs a C compiler and python3-dev.

Usage: python3 bench/monitoring_speed.py [--requests N] [--runs N] [--python PYTHON]
PYTHON must have mps-health installed; node_exporter is Debian's prometheus-node-exporter.
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"

# The load generator: its own process, so its GIL never slows the exporter under test.
SCRAPERS = r"""
import http.client, json, sys, threading, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
threads, per_thread = int(sys.argv[4]), int(sys.argv[5])
lat, errors, start = [], [], threading.Barrier(threads)
def scraper():
    conn = http.client.HTTPConnection(host, port, timeout=10)
    start.wait()
    for _ in range(per_thread):
        t0 = time.perf_counter()
        try:
            conn.request("GET", path, headers={"Accept": "text/plain"})
            body = conn.getresponse().read()
            assert b"mps_health_daemon_up" in body
        except Exception as e:
            errors.append(repr(e))
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
            continue
        lat.append(time.perf_counter() - t0)
ts = [threading.Thread(target=scraper) for _ in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"latencies": lat, "errors": errors[:3], "error_count": len(errors)}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, timeout: float = 30.0) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            if b"mps_health_daemon_up" in body:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"port {port} never served mps_health_daemon_up")


def scrape(port: int, threads: int, per_thread: int) -> Tuple[List[float], int]:
    import json

    r = subprocess.run([sys.executable, "-c", SCRAPERS, "127.0.0.1", str(port), "/metrics",
                        str(threads), str(per_thread)], capture_output=True, text=True,
                       timeout=600)
    data = json.loads(r.stdout)
    return data["latencies"], data["error_count"]


def p(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(argv: List[str], env: Dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)
    return time.perf_counter() - t0


def build_fast_client(bindir: Path) -> Path:
    """The fake binaries (tests/helpers/fakebin.py, the client in C) in ``bindir``."""
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from fakebin import install_fakes

    return install_fakes(bindir, fast_client=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000, help="scrapes per target")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=20, help="runs of each check command")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        raise SystemExit("install prometheus-node-exporter (Debian) for the baseline")

    work = Path(tempfile.mkdtemp(prefix="mps-bench-mon-"))
    bindir = work / "bin"
    bindir.mkdir()
    control = build_fast_client(bindir)
    env = dict(os.environ, PATH=f"{bindir}:{FAKE.parent}:{os.environ['PATH']}")
    pipe, log, textdir = work / "pipe", work / "log", work / "textfile"
    for d in (pipe, log, textdir):
        d.mkdir()
        d.chmod(0o777)
    cfg = work / "config.yaml"
    cfg.write_text(f"run_dir: {work}/run\nstate_dir: {work}/state\n"
                   f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n"
                   f"  binary_dirs: [{bindir}]\n")  # never PATH: where the fakes are
    daemon_env = dict(env, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    subprocess.run([str(control), "-d"], check=True, timeout=10, env=daemon_env)
    time.sleep(0.3)
    daemon = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    procs: List[subprocess.Popen] = []
    try:
        mh = [args.python, "-m", "mps_health.cli.main"]
        subprocess.run([*mh, "exporter", "--config", str(cfg), "--textfile", str(textdir)],
                       env=env, check=True, timeout=60)
        ours, theirs = free_port(), free_port()
        procs.append(subprocess.Popen(
            [*mh, "exporter", "--config", str(cfg), "--listen", f"127.0.0.1:{ours}",
             "--interval", "30"], env=env, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            [node_exporter, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textdir}",
             f"--web.listen-address=127.0.0.1:{theirs}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(ours)
        wait_http(theirs)
        per_round = max(1, args.requests // args.rounds // args.threads)
        lat: Dict[str, List[float]] = {"mps-health exporter": [], "node_exporter textfile": []}
        errors = {k: 0 for k in lat}
        scrape(ours, args.threads, 5)  # warm both up
        scrape(theirs, args.threads, 5)
        for _ in range(args.rounds):
            for name, port in (("mps-health exporter", ours), ("node_exporter textfile", theirs)):
                got, bad = scrape(port, args.threads, per_round)
                lat[name] += got
                errors[name] += bad
        rss = {"mps-health exporter": rss_mb(procs[0].pid),
               "node_exporter textfile": rss_mb(procs[1].pid)}
        sizes = {"mps-health exporter": len(subprocess.run(
            ["curl", "-s", f"http://127.0.0.1:{ours}/metrics"], capture_output=True).stdout),
            "node_exporter textfile": len(subprocess.run(
                ["curl", "-s", f"http://127.0.0.1:{theirs}/metrics"], capture_output=True).stdout)}

        print(f"scrapes: {args.threads} concurrent scrapers, {len(lat['mps-health exporter'])} "
              f"scrapes per target in {args.rounds} alternating rounds "
              f"(fake client: C)")
        print(f"{'target':24} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'RSS MB':>7} "
              f"{'bytes':>6} errors")
        for name, xs in lat.items():
            print(f"{name:24} {statistics.median(xs) * 1e3:10.2f} {p(xs, 0.99) * 1e3:8.2f} "
                  f"{max(xs) * 1e3:8.2f} {rss[name]:7.1f} {sizes[name]:6d} {errors[name]}")
        a, b = lat["mps-health exporter"], lat["node_exporter textfile"]
        ratio = statistics.median(a) / statistics.median(b)
        print(f"ratio ours/node_exporter: median {ratio:.2f}, "
              f"p99 {p(a, 0.99) / p(b, 0.99):.2f} (goal: p99 <= 1.00)")
        print(f"exporter memory: {rss['mps-health exporter']:.1f} MB (goal: < 60 MB)")

        # check_mps against mps-health check, alternating, same checks.
        selections = (("all checks", []), ("without the control query", ["--skip", "control"]))
        for label, sel in selections:
            plugin = [args.python, "-m", "mps_health.cli.check_mps", "--config", str(cfg), *sel]
            check = [*mh, "check", "--config", str(cfg), *sel]
            t_plugin, t_check = [], []
            for _ in range(args.runs):
                t_plugin.append(timed(plugin, env))
                t_check.append(timed(check, env))
            mp, mc = statistics.median(t_plugin), statistics.median(t_check)
            print(f"check_mps {mp * 1e3:.1f} ms vs mps-health check {mc * 1e3:.1f} ms "
                  f"({label}, median of {args.runs}): ratio {mp / mc:.2f}")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)  # the fake daemon we started, by its PID
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
