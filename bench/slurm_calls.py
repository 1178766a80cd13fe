#!/usr/bin/env python3
"""How many Slurm calls one ``mps-health check`` makes, and what Slurm facts cost.

    python3 bench/slurm_calls.py [RUNS] [--slurm24]   (root: it starts a real Slurm)

Starts the one-node Slurm of tests/helpers/slurmcluster.py and a fake MPS daemon, puts counting
wrappers for scontrol and squeue first on PATH, and runs the full check RUNS times
(default 15) per setup, against ``python3 -c pass`` measured in the same run. Prints
calls per run (the goal: one scontrol call; per-job layouts add one squeue, started
at the same time) and median wall times with their ratio to the baseline. With
``--slurm24`` the cluster is Slurm 24.11 in a Debian 13 root (tests/helpers/slurmroot.py; the
times then include entering the root's namespace for each call).
"""

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))

from slurmcluster import SlurmCluster, skip_reason  # noqa: E402 (needs sys.path)
from slurmroot import SlurmRoot, make_root, remove_root  # noqa: E402


@contextlib.contextmanager
def where(slurm24: bool) -> Iterator[Optional[SlurmRoot]]:
    """None (this machine's Slurm) or a started Debian 13 root with Slurm 24.11."""
    if not slurm24:
        yield None
        return
    from debian_root import cache_dir

    root = make_root(Path(tempfile.mkdtemp(prefix="debian13-slurm24-", dir="/var/tmp")),
                     cache_dir())
    try:
        yield root.start()
    finally:
        remove_root(root)

WRAPPER = """#!/bin/sh
echo "{name}" >> "$MPS_BENCH_CALLS"
exec {real} "$@"
"""


def timed(argv: List[str], env: Dict[str, str]) -> Tuple[float, int]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
    return time.perf_counter() - t0, r.returncode


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--slurm24"]
    runs = int(args[0]) if args else 15
    slurm24 = "--slurm24" in sys.argv[1:]
    reason = skip_reason() if not slurm24 else None
    if reason:
        print(f"bench/slurm_calls.py: {reason}", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="mps-bench-"))
    wrappers = work / "bin"
    wrappers.mkdir()
    calls = work / "calls"
    pipe, log = work / "pipe", work / "log"
    for d in (pipe, log):
        d.mkdir()
        d.chmod(0o777)
    fake = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"
    with where(slurm24) as root, SlurmCluster(root=root) as cluster:
        print(f"{cluster.version}:")
        for name in ("scontrol", "squeue"):
            path = wrappers / name
            real = shutil.which(name, path=cluster.env["PATH"])
            path.write_text(WRAPPER.format(name=name, real=real))
            path.chmod(0o755)
        env = dict(cluster.env, PATH=f"{wrappers}:{REPO / 'tests' / 'fakes'}:"
                   f"{os.environ.get('PATH', '')}", MPS_BENCH_CALLS=str(calls),
                   SLURMD_NODENAME=cluster.node_name, CUDA_MPS_PIPE_DIRECTORY=str(pipe),
                   CUDA_MPS_LOG_DIRECTORY=str(log))
        subprocess.run([sys.executable, str(fake), "-d"], env=env, check=True, timeout=10)
        pid_file = pipe / "nvidia-cuda-mps-control.pid"
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the daemon writes it after it forks
        daemon = int(pid_file.read_text())
        base = f"run_dir: {work}/run\nstate_dir: {work}/state\n"
        fakes = f"  binary_dirs: [{fake.parent}]\n"  # never PATH: where the fakes are
        node = f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n{fakes}"
        per_job = (f"mps:\n  layout: per-job\n  pipe_dir: {work}/mps_job{{job}}\n"
                   f"  log_dir: {work}/log_job{{job}}\n{fakes}")
        setups = {
            "no Slurm section (core checks only)": base + node,
            "slurm: node layout (+gres-drift, orphans)": base + node + "slurm: {}\n",
            "slurm: per-job layout": base + per_job + "slurm: {}\n",
        }
        mps_health = [sys.executable, "-m", "mps_health.cli.main", "check", "--config"]
        try:
            baseline = [timed([sys.executable, "-c", "pass"], env)[0] for _ in range(runs)]
            ref = statistics.median(baseline)
            print(f"python3 -c pass: median {ref * 1000:.1f} ms over {runs} runs")
            for label, text in setups.items():
                cfg = work / "config.yaml"
                cfg.write_text(text)
                calls.write_text("")
                first_rc = timed([*mps_health, str(cfg)], env)[1]  # a cold run
                first = calls.read_text().split()
                calls.write_text("")
                times = [timed([*mps_health, str(cfg)], env)[0] for _ in range(runs)]
                made = calls.read_text().split()
                per_run = {n: made.count(n) / runs for n in ("scontrol", "squeue")}
                med = statistics.median(times)
                print(f"{label}: exit {first_rc}; first run called "
                      f"{' '.join(first) or 'nothing'}; then per run: scontrol "
                      f"{per_run['scontrol']:g}, squeue {per_run['squeue']:g}; median "
                      f"{med * 1000:.1f} ms = {med / ref:.2f}x python3 -c pass")
        finally:
            os.kill(daemon, signal.SIGKILL)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
