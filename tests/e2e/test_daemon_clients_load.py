"""Control clients running during every check never count as a second daemon, on a loaded
machine.

A control client is the daemon's own binary without ``-d``/``-f``: its argv0 is
``nvidia-cuda-mps-control``, its comm ``nvidia-cuda-mps``, its environment names the pipe
dir and /proc/PID/exe is the configured binary; an admin's ``echo get_server_list |
nvidia-cuda-mps-control``, a prolog's query, or the check's own. Here the clients are the
fake's executable (tests/helpers/fakebin.py), so they look to /proc exactly as the real binary
does, and they stay alive through every check (an admin typing at the client), while
others come and go and busy loops keep both CPUs loaded. Every check must be OK.
"""

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

from clirun import mps_health
from mps_health.probes.proc import read_processes
from mpsdaemon import mps_env
from nodesite import Site
from paths import FAKE_CONTROL, fake_binaries

RUNS = 20  # the waiting clients are there in every run: each run is a full trial
WAITING_CLIENTS = 4  # alive during every check
LOADERS = 2  # busy loops: the machine the false alarm was seen on had two cores


def churn(pipe: Path, stop: threading.Event) -> None:
    """Short-lived queries, one after another, as a prolog's or a script's."""
    while not stop.is_set():
        subprocess.run([FAKE_CONTROL], input="get_server_list\n", env=mps_env(pipe),
                       capture_output=True, text=True, timeout=30)


def test_healthy_checks_stay_ok_while_clients_run(site: Site) -> None:
    started = site.start_daemon()
    pipe, daemon = started.pipe_dir, started.pid
    config = site.config(commands={"nvidia-cuda-mps-control": FAKE_CONTROL})
    waiting: List[subprocess.Popen] = []
    loaders: List[subprocess.Popen] = []
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(pipe, stop), daemon=True)
    reports = []
    try:
        waiting = [subprocess.Popen([FAKE_CONTROL], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, env=mps_env(pipe))
                   for _ in range(WAITING_CLIENTS)]
        loaders = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(LOADERS)]
        churner.start()
        for _ in range(RUNS):
            seen = [p for p in read_processes("/proc", fake_binaries())
                    if p.pipe_dir == str(pipe)]
            clients = [p for p in seen if p.role == "client"]
            # The clients look like the daemon in all but the flag: same binary, name, dir.
            assert len(clients) >= WAITING_CLIENTS and all(c.genuine for c in clients)
            assert [p.pid for p in seen if p.role == "control"] == [daemon]
            # The daemon check alone: strays looks at the whole host, which other tests
            # share.
            r = mps_health("check", "--config", config, "--only", "daemon", "--format", "json")
            reports.append((r.returncode, r.stdout + r.stderr))
    finally:
        stop.set()
        for p in waiting:
            p.kill()
        for p in loaders:
            p.kill()
        for p in (*waiting, *loaders):
            p.wait()
        churner.join(30)
    failed = [(rc, out) for rc, out in reports if rc != 0]
    assert failed == [], f"{len(failed)} of {RUNS} healthy checks failed: {failed[0]}"
    for _, out in reports:
        report = json.loads(out)
        assert report["problems"] == []
        assert f"control daemon {daemon} serves" in report["checks"][0]["results"][0]["message"]
