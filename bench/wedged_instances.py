#!/usr/bin/env python3
"""Several wedged instances cost one timeout, not one per instance nor one per query.

Eight per-GPU instances (fake daemons on a machine without a GPU; the real binaries
with --real, where each daemon gets CUDA_VISIBLE_DEVICES of its index modulo the GPU
count) are checked with 0, 1, 4 and 8 of their daemons SIGSTOPped. A check that asked
them one after another would take N x the control timeout; ours should take about one.
With the fakes each daemon also runs a server (``fake_server_start``), so the servers
probe has a daemon to ask: the whole check and ``mps-health clients`` are timed too,
and should take one timeout as well, not two (the control query, then the server list).
Each line gives the wall time and its ratio to one control timeout.

Usage: python3 bench/wedged_instances.py [--real] [--instances 8] [--timeout 1.0]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=1, help="real GPUs to spread daemons over")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mps-wedge-"))
    env = dict(os.environ)
    if not args.real:
        bindir = work / "bin"
        bindir.mkdir()
        sys.path.insert(0, str(REPO / "tests" / "helpers"))
        from fakebin import install_fakes  # the fake binaries, the client in C

        install_fakes(bindir, fast_client=True)
        env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    n = args.instances
    gpus = list(range(n))
    config = work / "config.yaml"
    config.write_text(f"run_dir: {work}/run\nmps:\n  layout: per-gpu\n"
                      f"  pipe_dir: {work}/pipe_{{gpu}}\n  log_dir: {work}/log_{{gpu}}\n"
                      f"  gpus: {gpus}\n"
                      + ("" if args.real else f"  binary_dirs: [{work / 'bin'}]\n")  # never PATH
                      + f"control:\n  timeout_s: {args.timeout}\n")
    pids: List[int] = []
    try:
        for g in gpus:
            pipe, log = work / f"pipe_{g}", work / f"log_{g}"
            for d in (pipe, log):
                d.mkdir()
                d.chmod(0o777)
            denv = dict(env, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log),
                        CUDA_VISIBLE_DEVICES=str(g % args.gpus))
            subprocess.run(["nvidia-cuda-mps-control", "-d"], env=denv, check=True, timeout=30)
        time.sleep(1.0)
        for g in gpus:
            pids.append(int((work / f"pipe_{g}" / "nvidia-cuda-mps-control.pid").read_text()))
            if not args.real:  # a server under each daemon: the servers probe asks it
                subprocess.run(["nvidia-cuda-mps-control"], input="fake_server_start\n",
                               env=dict(env, CUDA_MPS_PIPE_DIRECTORY=str(work / f"pipe_{g}")),
                               text=True, capture_output=True, timeout=30, check=True)
        cli = [sys.executable, "-m", "mps_health.cli.main"]
        commands = [("check --only control", [*cli, "check", "--config", str(config),
                                              "--only", "control"])]
        if not args.real:
            commands += [("check", [*cli, "check", "--config", str(config)]),
                         ("clients", [*cli, "clients", "--config", str(config)])]
        print(f"{n} instances, control timeout {args.timeout:g} s "
              f"({'real daemons' if args.real else 'fake daemons, one server each'})")
        for wedged in sorted({0, 1, n // 2, n}):
            for name, command in commands:
                for pid in pids[:wedged]:
                    os.kill(pid, signal.SIGSTOP)
                t0 = time.perf_counter()
                r = subprocess.run(command, env=env, capture_output=True, text=True,
                                   timeout=120)
                took = time.perf_counter() - t0
                for pid in pids[:wedged]:
                    os.kill(pid, signal.SIGCONT)
                reported = sum(1 for line in r.stdout.splitlines()
                               if line.startswith("CRITICAL control[")
                               and "control-wedged" in line)
                serial = wedged * args.timeout
                print(f"  {wedged} wedged, {name:<20}: {took:5.2f} s "
                      f"(ratio to one timeout {took / args.timeout:.2f}), exit {r.returncode}"
                      + (f", {reported} reported wedged" if name.startswith("check") else "")
                      + (f"; one at a time would take >= {serial:4.1f} s" if serial else ""))
    finally:
        for g, pid in enumerate(pids):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
            denv = dict(env, CUDA_MPS_PIPE_DIRECTORY=str(work / f"pipe_{g}"))
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=denv, text=True,
                           capture_output=True, timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
