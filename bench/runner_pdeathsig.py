#!/usr/bin/env python3
"""What starting each external command through ``setpriv --pdeathsig KILL`` costs.

mps_health.hostio.runner starts every command (the control client, scontrol, squeue) through
util-linux's setpriv so that it dies with the run. That is one more exec per command;
this prints the cost per command with and without it, measured in the same run, as a
ratio (a check on a healthy node starts one control client).

Usage: python3 bench/runner_pdeathsig.py [--runs N]
"""

import argparse
import time

from mps_health.hostio import runner


def per_command_ms(runs: int) -> float:
    t0 = time.perf_counter()
    for _ in range(runs):
        runner.run(["/bin/true"], 5)
    return (time.perf_counter() - t0) / runs * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    args = p.parse_args()
    if runner._SETPRIV is None:
        raise SystemExit("setpriv not found: commands start without it here")
    per_command_ms(20)  # warm up
    wrapped = per_command_ms(args.runs)
    saved, runner._SETPRIV = runner._SETPRIV, None
    try:
        plain = per_command_ms(args.runs)
    finally:
        runner._SETPRIV = saved
    print(f"/bin/true through the runner: {plain:.2f} ms plain, {wrapped:.2f} ms with "
          f"setpriv --pdeathsig: {wrapped / plain:.2f}x, +{wrapped - plain:.2f} ms per command")


if __name__ == "__main__":
    main()
