#!/usr/bin/env python3
"""What the clients check adds to `mps-health check`, idle and with clients, in one run.

Interleaved runs of, on one fake daemon (tests/fakes; --real: the real binaries):

* `mps-health check` with the default checks (baseline);
* the same with a `clients:` section (the clients check on): an idle daemon costs two
  small /proc reads per instance (no query, no squeue);
* both again while two client processes are connected through a fake server: the
  servers probe then asks each server's details and reads each client's /proc, and
  squeue (a stand-in script here) is run once.

Printed as medians and ratios against the baseline of the same state. Usage:
python3 bench/clients_cost.py [--runs N] [--real]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent


def timed(argv: List[str], env: Dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--real", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mpsh-bench-clients-"))
    pipe, log = base / "pipe", base / "log"
    for d in (pipe, log):
        d.mkdir()
        d.chmod(0o777)
    if args.real:
        control = shutil.which("nvidia-cuda-mps-control")
    else:  # the fake as an executable (tests/helpers/fakebin.py), as mps-health judges binaries
        sys.path.insert(0, str(REPO / "tests" / "helpers"))
        from fakebin import install_fakes

        control = str(install_fakes(base / "bin", fast_client=False))
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    squeue = base / "squeue"
    squeue.write_text("#!/bin/sh\necho '7|root|0|RUNNING|0:42|gres:mps:50'\n")
    squeue.chmod(0o755)
    common = (f"run_dir: {base}/run\nstate_dir: {base}/state\nmps:\n  pipe_dir: {pipe}\n"
              f"  log_dir: {log}\ncommands:\n  nvidia-cuda-mps-control: {control}\n"
              f"  squeue: {squeue}\nchecks:\n  disable: [strays]\n")
    plain, clients = base / "plain.yaml", base / "clients.yaml"
    plain.write_text(common)
    clients.write_text(common + "clients: {}\n")
    start = [control, "-d"]
    subprocess.run(start, env=env, check=True, timeout=30)
    time.sleep(0.5)
    sleepers: List[subprocess.Popen] = []
    try:
        results: Dict[str, List[float]] = {}
        for state in ("idle", "two clients"):
            if state == "two clients":
                if args.real:
                    print("(--real: connect CUDA clients by hand; skipping the busy state)")
                    break
                for _ in range(2):
                    p = subprocess.Popen(["sleep", "600"], env=dict(env, SLURM_JOB_ID="7"))
                    sleepers.append(p)
                    subprocess.run([control], input=f"fake_client_connect "
                                   f"{p.pid} 0\n", env=env, text=True, capture_output=True)
            for name in ("check", "check + clients"):
                results[f"{state}: {name}"] = []
            for _ in range(args.runs):
                for name, cfg in (("check", plain), ("check + clients", clients)):
                    argv = [sys.executable, "-m", "mps_health.cli.main", "check", "--config", str(cfg)]
                    results[f"{state}: {name}"].append(timed(argv, env))
        for key, xs in results.items():
            state = key.split(":")[0]
            ref = statistics.median(results[f"{state}: check"])
            print(f"{key:<32} median {statistics.median(xs) * 1000:7.1f} ms  "
                  f"ratio {statistics.median(xs) / ref:5.2f}")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        argv = [control]
        subprocess.run(argv, input="quit\n", env=env, text=True, capture_output=True,
                       timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
