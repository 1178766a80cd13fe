#!/usr/bin/env python3
"""What starting each external command through ``setpriv --pdeathsig KILL`` costs.

mps_health.hostio.runner starts every command (the control client, scontrol, squeue) through
util-linux's setpriv so that it dies with the run. That is one more exec per command;
this prints the cost per command with and without it, measured in the same run, as a
ratio (a check on a healthy node starts one control client). Then what the runner's wait
for setpriv's exec costs a command fed stdin (``/bin/cat``, as the control client is fed its
query): wall and CPU per command with the wait and with it skipped, in the same run.

Usage: python3 bench/runner_pdeathsig.py [--runs N]
"""

import argparse
import time

from mps_health.hostio import runner


def per_command_ms(runs: int) -> float:
    return per_command(runs, ("/bin/true",), "")[0]


def per_command(runs: int, argv: tuple, stdin: str) -> tuple:
    """(wall ms, CPU ms of this process) per command."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(runs):
        runner.run(list(argv), 5, stdin=stdin)
    return ((time.perf_counter() - t0) / runs * 1000, (time.process_time() - c0) / runs * 1000)


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
    fed = ("/bin/cat",), "get_server_list\n"
    waited = per_command(args.runs, *fed)
    saved_wait, runner._armed = runner._armed, lambda pid, wrapper, wait_s, poll_s: True
    try:
        unwaited = per_command(args.runs, *fed)
    finally:
        runner._armed = saved_wait
    print(f"/bin/cat fed stdin: {waited[0]:.2f} ms (CPU {waited[1]:.2f}) waiting for setpriv's "
          f"exec, {unwaited[0]:.2f} ms (CPU {unwaited[1]:.2f}) without: "
          f"{waited[0] / unwaited[0]:.2f}x wall, {waited[1] / unwaited[1]:.2f}x CPU")


if __name__ == "__main__":
    main()
