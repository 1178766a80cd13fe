#!/usr/bin/env python3
"""Hostile inputs cost work and memory in proportion to their size, never more.

1. Snapshots of many per-job instances (the shipped broken node's, every instance
   without a daemon: four problems each) replayed in text and JSON; then (text) with a
   daemon process, dirs and a control answer for each instance. A baseline of 2000
   instances and a large one (default 100000, the most ``mps.max_instances`` allows)
   are measured in the same run; with linear output the time and memory ratios stay
   near the instance ratio or below it (a fixed start-up cost is in both).
2. A snapshot of 200000 instances under the default ``mps.max_instances`` (256): only
   256 are judged, the rest counted in one line.
3. A YAML alias bomb of a few hundred bytes (9**9 values) against a plain config.

Every command runs in a child capped at 3 GiB of address space (util-linux prlimit);
its peak RSS comes from wait4. Usage: python3 bench/hostile_inputs.py [--large 100000]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
BROKEN = REPO / "examples" / "broken-node.json"
CAP = 3 << 30


def snapshot(n: int, max_instances: int, daemons: bool = False) -> Dict[str, Any]:
    """``n`` per-job instances; ``daemons``: each with its dirs, a control daemon
    process and a control answer (one process per instance: judging each instance
    against every process would be quadratic)."""
    data = json.loads(BROKEN.read_text())
    data["config"] = {"mps": {"layout": "per-job", "max_instances": max_instances}}
    data["instances"] = [
        {"name": f"job{i}", "layout": "per-job", "job_id": str(i), "gpu": None,
         "pipe_dir": f"/tmp/nvidia-mps_job{i}", "log_dir": f"/tmp/nvidia-log_job{i}"}
        for i in range(n)]
    sources = data["sources"]
    pipe, log = (sources["dirs"][k] for k in sorted(sources["dirs"], reverse=True))
    sources["control"], sources["dirs"] = {}, {}
    if daemons:
        sources["processes"] = []
        for i in range(n):
            pipe_dir, log_dir = f"/tmp/nvidia-mps_job{i}", f"/tmp/nvidia-log_job{i}"
            sources["dirs"][pipe_dir] = dict(pipe, path=pipe_dir, pid_file=str(10000 + i))
            sources["dirs"][log_dir] = dict(log, path=log_dir)
            sources["control"][f"job{i}"] = {
                "command": "get_default_active_thread_percentage", "detail": "",
                "latency_s": 0.01, "rc": 0, "status": "ok", "stderr": "", "stdout": "100.0"}
            sources["processes"].append({
                "cmdline": ["nvidia-cuda-mps-control", "-d"], "environ_readable": True,
                "pid": 10000 + i, "pipe_dir": pipe_dir, "ppid": 1, "role": "control",
                "start_ticks": 5, "state": "S", "uid": 0})
    return data


def make(path: Path, n: int, max_instances: int, daemons: bool = False) -> None:
    """Write a snapshot in a child: the kernel counts the memory this process has when
    it starts a command in that command's peak RSS, so this one stays small."""
    subprocess.run([sys.executable, __file__, "--make", str(path), str(n), str(max_instances),
                    str(int(daemons))], check=True)


def measure(args: List[str], work: Path) -> Tuple[float, float, int, str]:
    """(seconds, peak RSS in MiB, bytes written to stdout, first stderr line) of
    ``mps-health ARGS`` in a memory-capped child."""
    out, err = work / "stdout", work / "stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        t0 = time.monotonic()
        # prlimit, not a preexec_fn: the child is then spawned, not forked.
        p = subprocess.Popen(
            ["prlimit", f"--as={CAP}", "--", sys.executable, "-m", "mps_health.cli.main", *args],
            stdout=o, stderr=e)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - t0
    first = (err.read_text(errors="replace").splitlines() or [""])[0]
    if p.returncode not in (0, 1, 2) or not out.stat().st_size:
        print(f"  (exit {p.returncode}, {out.stat().st_size} bytes out: {first[:200]})")
    return seconds, usage.ru_maxrss / 1024, out.stat().st_size, first[:120]


def alias_bomb(levels: int) -> str:
    anchors = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        anchors.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "mps:\n  gpus: [" + ", ".join(anchors) + "]\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=int, default=2000)
    ap.add_argument("--large", type=int, default=100000)
    ap.add_argument("--make", nargs=4, metavar=("FILE", "N", "MAX", "DAEMONS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        path, n, cap, daemons = args.make
        Path(path).write_text(json.dumps(snapshot(int(n), int(cap), daemons == "1")))
        return 0
    work = Path(tempfile.mkdtemp(prefix="mps-health-bench-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run(args: argparse.Namespace, work: Path) -> None:
    sizes = {"base": args.base, "large": args.large}
    for daemons, formats in ((False, ("text", "json")), (True, ("text",))):
        files = {}
        for name, n in sizes.items():
            files[name] = work / f"{name}.json"
            make(files[name], n, 100000, daemons)
        print(f"snapshots {'with a daemon each' if daemons else 'without daemons'}: "
              f"{args.base} instances {files['base'].stat().st_size >> 10} KiB, "
              f"{args.large} instances {files['large'].stat().st_size >> 10} KiB")
        for fmt in formats:
            # The baseline is short: its best of three, so one slow start on a shared
            # machine does not make the large run look better than it is.
            # --budget 300: a replay is judged within the run's hard limit (its budget
            # plus a grace), which 100000 instances pass on a loaded machine.
            argv = ["check", "--budget", "300", "--format", fmt, "--replay"]
            got = {name: min(measure([*argv, str(path)], work)
                             for _ in range(3 if name == "base" else 1))
                   for name, path in files.items()}
            (bt, bm, bo, _), (lt, lm, lo, _) = got["base"], got["large"]
            print(f"  {fmt:5} {args.base:>6}: {bt:6.2f} s {bm:7.1f} MiB out "
                  f"{bo >> 10:>7} KiB | {args.large:>6}: {lt:6.2f} s {lm:7.1f} MiB out "
                  f"{lo >> 10:>7} KiB | ratios: instances {args.large / args.base:.0f}x, "
                  f"time {lt / bt:.1f}x, peak RSS {lm / bm:.1f}x, output {lo / bo:.1f}x")

    capped = work / "capped.json"
    make(capped, 200000, 256)
    t, m, o, _ = measure(["check", "--replay", str(capped)], work)
    print(f"200000 instances, mps.max_instances 256: {t:.2f} s {m:.1f} MiB, "
          f"{o >> 10} KiB of output (256 judged, the rest counted)")

    plain, bomb = work / "plain.yaml", work / "bomb.yaml"
    plain.write_text("mps:\n  gpus: [lol]\n")
    bomb.write_text(alias_bomb(9))
    pt, pm, _, _ = measure(["check", "--config", str(plain)], work)
    bt, bm, _, line = measure(["check", "--config", str(bomb)], work)
    print(f"alias bomb ({bomb.stat().st_size} bytes, 9**9 values): {bt:.2f} s {bm:.1f} MiB "
          f"against a plain config {pt:.2f} s {pm:.1f} MiB; it says: {line}")


if __name__ == "__main__":
    sys.exit(main())
