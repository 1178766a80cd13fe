#!/usr/bin/env python3
"""Do the servers and logs checks (on by default) change the cost of the fast tier?

Runs ``mps-health check`` against a fake daemon (tests/fakes), idle as most nodes are
between jobs, in three ways in the same run, interleaved so that noise hits all alike:

  baseline   --skip servers,logs   the fast tier without them
  default    (no option)           what slurmd runs now: with the servers and logs checks
  python     python3 -c pass       the floor DEVELOPING.md measures against

and prints the median wall time of each and the ratios. Not a test: nothing fails.
Usage: python3 bench/bench_deep_fast_tier.py [ROUNDS]   (default 30)
"""

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "nvidia-cuda-mps-control"


def timed(argv, env) -> tuple:
    """(wall seconds, CPU seconds of the command and its children): CPU time is less
    disturbed by other work on a shared machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    work = Path(tempfile.mkdtemp(prefix="bench-deep-"))
    pipe, log = work / "pipe", work / "log"
    for d in (pipe, log):
        d.mkdir()
        d.chmod(0o777)
    (log / "control.log").write_text(
        "".join(f"[2026-12-02 12:28:{i % 60:02d}.570 Control   436] Accepting connection... "
                "command: get_default_active_thread_percentage\n" for i in range(2000)))
    cfg = work / "config.yaml"
    cfg.write_text(f"run_dir: {work}/run\nstate_dir: {work}/state\n"
                   f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n"
                   f"  binary_dirs: [{FAKE.parent}]\n")  # never PATH: where the fakes are
    env = dict(os.environ, PATH=f"{FAKE.parent}{os.pathsep}{os.environ['PATH']}",
               CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    subprocess.run([sys.executable, str(FAKE), "-d"], env=env, check=True)
    time.sleep(0.3)
    daemon = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    check = [sys.executable, "-m", "mps_health.cli.main", "check", "--config", str(cfg),
             "--skip", "tmpfiles"]
    runs = {
        "baseline": [*check[:-1], "tmpfiles,servers,logs"],
        "default": check,
        "python": [sys.executable, "-c", "pass"],
    }
    times = {name: [] for name in runs}
    try:
        for argv in runs.values():
            timed(argv, env)  # warm the page cache
        for _ in range(rounds):
            for name, argv in runs.items():
                times[name].append(timed(argv, env))
    finally:
        os.kill(daemon, 9)  # the fake daemon this script started, by its PID
    for i, what in ((0, "wall"), (1, "cpu")):
        med = {name: statistics.median(t[i] for t in ts) for name, ts in times.items()}
        for name in runs:
            print(f"{what:4s} {name:9s} median {med[name] * 1000:7.1f} ms over {rounds} rounds")
        print(f"{what:4s} default / baseline = {med['default'] / med['baseline']:.3f}  "
              "(the cost the servers and logs checks add to the fast tier)")
        print(f"{what:4s} default / python   = {med['default'] / med['python']:.3f}")
        print(f"{what:4s} baseline / python  = {med['baseline'] / med['python']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
