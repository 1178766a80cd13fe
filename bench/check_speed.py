#!/usr/bin/env python3
"""How much `mps-health check` costs beyond starting Python, against a hand audit script.

Everything is measured in one run and printed as ratios, so the figures do not depend
on the machine's speed:

* baseline: `python3 -c pass` with the same interpreter that runs mps-health;
* `mps-health check` on a healthy node (one daemon answering), run as its installed
  entry point;
* `check_mps`, the Nagios plugin, on the same node, against `mps-health check`;
* with --instructions, also `mps-health-healthcheck`, slurmd's HealthCheckProgram;
* the check with a config file given with --config (read and parsed on every run);
* a hand audit as a shell script, as sites run one without mps-health: pgrep, the
  control query, stat, scontrol;
* a wedged (SIGSTOPped) daemon: the check must return within the control timeout + 0.5 s;
* that audit with slurmctld down: scontrol alone blocks for seconds.

On a machine without a GPU the daemon is tests/fakes' fake, and its client is the C
version (tests/fakes/launcher.c's FAST_CLIENT, built by tests/helpers/fakebin.py) so the query
costs what the real C client costs.
On a GPU node (--real) the real nvidia-cuda-mps-control is used.

With --instructions (valgrind installed), each of python3 -c pass, the check
and check_mps also runs once under valgrind's cachegrind, which counts the instructions
the process executes in user space: the same count on a busy machine as on an idle one
(unlike wall or CPU time), so it shows what a change saves where other helpers load the
machine. It leaves out the kernel's share (exec, page faults, the client process).

Usage: python3 bench/check_speed.py [--runs N] [--real] [--python PYTHON] [--instructions]
PYTHON must have mps-health installed, its commands beside it (not editable: an
editable install adds its finder to every interpreter start, the baseline's too), and
should start as fast as a plain interpreter does (compare its `-c pass` with
`-S -E -c pass` below).

As root the bench runs in a private PID and mount namespace (unshare), with empty
file systems over /tmp, /run, /var/lib and /var/log: other processes on a shared
machine cannot make the node look unhealthy, the default dirs are free (no config file
is read), and the host's state is left alone. PYTHON must live elsewhere.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from _timing import run_timed

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"

HAND_AUDIT = r"""#!/bin/sh
# A hand audit as sites run one (an Ansible playbook's tasks, as one shell script).
pgrep nvidia-cuda-mps >/dev/null
echo get_default_active_thread_percentage | nvidia-cuda-mps-control >/dev/null
stat -c %a "$CUDA_MPS_PIPE_DIRECTORY" >/dev/null
if [ -n "$WITH_SCONTROL" ]; then scontrol show node "$(hostname -s)" | grep -E "Gres|State" >/dev/null; fi
exit 0
"""


# CPU seconds (user + system) of each timed command and what it waited for, by argv: on
# a loaded machine wall times swing with the load, CPU time much less.
CPU: Dict[str, List[float]] = {}


def timed(argv: List[str], env: Dict[str, str], runs: int, timeout: float = 60) -> List[float]:
    """Wall seconds of each run (``_timing.run_timed``); the CPU times kept in CPU."""
    out = []
    for _ in range(runs):
        wall, _, cpu = run_timed(argv, env, timeout)
        out.append(wall)
        CPU.setdefault(" ".join(argv), []).append(cpu)
    return out


def cpu_ratio(argv: List[str], base: List[str]) -> str:
    mine, theirs = med(CPU[" ".join(argv)]), med(CPU[" ".join(base)])
    return f"CPU {mine * 1000:.1f} ms, ratio {mine / theirs:.2f}"


def instructions(argv: List[str], env: Dict[str, str], logs: Path) -> int:
    """User-space instructions ``argv`` executes (valgrind; its children run natively)."""
    logs.mkdir(exist_ok=True)
    log = logs / "cachegrind.log"
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    "--cachegrind-out-file=/dev/null", f"--log-file={log}", *argv],
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    for line in log.read_text().splitlines():
        if "I   refs:" in line:
            return int(line.rsplit(":", 1)[1].replace(",", ""))
    raise RuntimeError(f"valgrind counted nothing for {argv}: {log.read_text()[-300:]}")


def med(xs: List[float]) -> float:
    return statistics.median(xs)


def spread(num: List[float], den: List[float]) -> str:
    """The quartiles of the per-round ratios (both series ran in the same rounds)."""
    ratios = sorted(n / d for n, d in zip(num, den))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"per-round ratio quartiles {q[0]:.2f}-{q[2]:.2f}"


def build_fast_client(bindir: Path) -> Optional[Path]:
    """The fake binaries (tests/helpers/fakebin.py, the client in C) in ``bindir``; None without
    a C compiler or python3-dev."""
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from fakebin import FakeBinError, install_fakes

    try:
        return install_fakes(bindir, fast_client=True)
    except (FakeBinError, OSError, subprocess.CalledProcessError):
        return None


# Empty in the private namespace: the default pipe, log, state and run dirs are free, and
# nothing of the host's is read or written (PYTHON must not live under these).
PRIVATE_DIRS = ("/tmp", "/run", "/var/lib", "/var/log")


def private_namespace() -> None:
    """Re-run this bench in a PID and mount namespace of its own (root only)."""
    if os.environ.get("MPS_BENCH_PRIVATE") == "1":
        for d in PRIVATE_DIRS:
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
        return
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("note: not root (or no unshare): other processes on this machine are seen")
        return
    os.environ["MPS_BENCH_PRIVATE"] = "1"
    os.execvp("unshare", ["unshare", "--mount", "--pid", "--fork", "--mount-proc",
                          sys.executable, *sys.argv])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--real", action="store_true", help="use the real MPS binaries (GPU node)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--control-timeout", type=float, default=2.0)
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions under valgrind (load-independent)")
    args = ap.parse_args()
    private_namespace()

    work = Path(tempfile.mkdtemp(prefix="mps-bench-"))
    bindir = work / "bin"
    # The defaults (no config file, so no YAML parse) when they are free; else private dirs.
    pipe, log = Path("/tmp/nvidia-mps"), Path("/var/log/nvidia-mps")
    use_defaults = not pipe.exists() and not log.exists()
    if not use_defaults:
        pipe, log = work / "pipe", work / "log"
    for d, mode in ((pipe, 0o777), (log, 0o755), (bindir, 0o777)):  # as the unit makes them
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    if not args.real:
        client = build_fast_client(bindir)
        if client is None:
            raise SystemExit("cannot build the fake MPS binaries: install gcc and python3-dev")
        env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
        if use_defaults and os.environ.get("MPS_BENCH_PRIVATE") == "1":
            # Without a config file mps-health looks for the binaries only in
            # mps.binary_dirs' defaults (root's fixed PATH among them), never on PATH:
            # the fakes stand in /usr/local/sbin, in this namespace only.
            subprocess.run(["mount", "--bind", str(bindir), "/usr/local/sbin"], check=True)
            env["PATH"] = f"/usr/local/sbin{os.pathsep}{env['PATH']}"  # the daemon from there
    config = work / "config.yaml"
    # mps-health finds the MPS binaries in mps.binary_dirs, never on PATH: the fakes' dir.
    dirs = "" if args.real else f"  binary_dirs: [{bindir}]\n"
    config.write_text(f"run_dir: {work}/run\nmps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n"
                      f"{dirs}control:\n  timeout_s: {args.control_timeout}\n")
    audit = work / "hand_audit.sh"
    audit.write_text(HAND_AUDIT)
    audit.chmod(0o755)
    entry = shutil.which("mps-health", path=str(Path(args.python).parent))
    base_cmd = [entry] if entry else [args.python, "-m", "mps_health.cli.main"]
    with_config = [*base_cmd, "check", "--config", str(config)]
    check = [*base_cmd, "check"] if use_defaults else with_config
    plugin_entry = shutil.which("check_mps", path=str(Path(args.python).parent))
    plugin = [plugin_entry] if plugin_entry else [args.python, "-m", "mps_health.cli.check_mps"]
    if not use_defaults:
        plugin += ["--config", str(config)]
    # slurmd's HealthCheckProgram, as slurmd starts it (no arguments). There is no Slurm
    # here: its scontrol call fails at once ("the node cannot be read"), in a child
    # process valgrind does not count; the count is the health check's own Python.
    hc_entry = shutil.which("mps-health-healthcheck", path=str(Path(args.python).parent))
    healthcheck = [hc_entry] if hc_entry else [*base_cmd, "healthcheck"]

    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
    time.sleep(0.5)
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    try:
        rc = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
        print(f"check on the healthy node: exit {rc.returncode}: {rc.stdout.splitlines()[0]}")
        rp = subprocess.run(plugin, env=env, capture_output=True, text=True, timeout=60)
        print(f"check_mps on the healthy node: exit {rp.returncode}: "
              f"{(rp.stdout.splitlines() or [rp.stderr])[0][:100]}")
        # Each command once before it is measured, as on a node after its first run
        # (Python has written the .pyc files of what it imported).
        rh = subprocess.run(healthcheck, env=env, capture_output=True, text=True, timeout=60)
        print(f"mps-health-healthcheck (no Slurm here): exit {rh.returncode}: "
              f"{(rh.stdout.splitlines() or [rh.stderr])[0][:100]}")
        # The same check with no site-packages processing at all (python -S -E, the
        # package's folder put on sys.path by hand): on an interpreter whose .pth files
        # are slow (a torch venv spends ~100 ms there), this is the check's own cost.
        # (Where PYTHON's mps_health lives: not this interpreter's, which may differ.)
        pkg_parent = subprocess.run(
            [args.python, "-c", "import os, mps_health; "
             "print(os.path.dirname(os.path.dirname(mps_health.__file__)))"],
            env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        bare_check = [args.python, "-S", "-E", "-c",
                      f"import sys, os; sys.path.insert(0, {pkg_parent!r}); "
                      "from mps_health.cli.main import main; sys.exit(main())", *check[1:]]
        core_only = [*bare_check, "--only", "daemon,control,directories,tmpfiles"]
        rb = subprocess.run(bare_check, env=env, capture_output=True, text=True, timeout=60)
        print(f"check under python3 -S -E: exit {rb.returncode}: "
              f"{(rb.stdout.splitlines() or [rb.stderr])[0][:100]}")
        results: Dict[str, List[float]] = {"python": [], "isolated": [], "check": [],
                                           "bare": [], "core": [], "config": [], "audit": [],
                                           "plugin": []}
        for _ in range(args.runs):  # interleaved, so drift hits every series alike
            results["python"] += timed([args.python, "-c", "pass"], env, 1)
            results["isolated"] += timed([args.python, "-S", "-E", "-c", "pass"], env, 1)
            results["bare"] += timed(bare_check, env, 1)
            results["core"] += timed(core_only, env, 1)
            results["check"] += timed(check, env, 1)
            results["plugin"] += timed(plugin, env, 1)
            results["config"] += timed(with_config, env, 1)
            results["audit"] += timed(["sh", str(audit)], env, 1)
        base = med(results["python"])
        print(f"\nhealthy node, median of {args.runs} runs:")
        iso = med(results["isolated"])
        print(f"  python3 -c pass          {base * 1000:7.1f} ms  (baseline)")
        print(f"  python3 -S -E -c pass    {iso * 1000:7.1f} ms  (no site-packages at all: "
              "what this interpreter's .pth files cost is the difference)")
        c = med(results["check"])
        what = "no config file" if use_defaults else "with a config file"
        print(f"  mps-health check         {c * 1000:7.1f} ms  ratio {c / base:.2f} "
              f"({what}; {spread(results['check'], results['python'])})")
        print(f"  check beyond the baseline: {(c - base) * 1000:+.1f} ms")
        py = [args.python, "-c", "pass"]
        print(f"  CPU time (user + system, median): python3 -c pass "
              f"{med(CPU[' '.join(py)]) * 1000:.1f} ms; check: {cpu_ratio(check, py)}")
        n = med(results["plugin"])
        print(f"  check_mps                {n * 1000:7.1f} ms  ratio {n / c:.2f} against "
              f"mps-health check ({spread(results['plugin'], results['check'])})")
        b = med(results["bare"])
        print(f"  check under python3 -S -E {b * 1000:6.1f} ms  ratio {b / iso:.2f} against "
              "python3 -S -E -c pass (the check's own cost, no .pth at all)")
        k = med(results["core"])
        print(f"  ... core checks only     {k * 1000:6.1f} ms  ratio {k / iso:.2f} (daemon, control, "
              "directories, tmpfiles: the core set)")
        y = med(results["config"])
        print(f"  ... with --config FILE   {y * 1000:7.1f} ms  ratio {y / base:.2f} (YAML parsed "
              "every run)")
        a = med(results["audit"])
        print(f"  hand audit (no Slurm)  {a * 1000:7.1f} ms  check/audit {c / a:.2f}")

        if args.instructions and shutil.which("valgrind"):
            counted = {name: instructions(argv, e, work / "valgrind") for name, argv, e in (
                ("python3 -c pass", [args.python, "-c", "pass"], env),
                ("mps-health check", check, env), ("check_mps", plugin, env),
                ("mps-health-healthcheck", healthcheck, env))}
            one = counted["python3 -c pass"]
            print("\ninstructions in user space (valgrind), ratio to python3 -c pass:")
            for name, n in counted.items():
                print(f"  {name:24} {n / 1e6:7.1f} M  ratio {n / one:.2f}")
        elif args.instructions:
            print("\n(valgrind not installed: no instruction counts)")

        # Wedged daemon.
        os.kill(pid, signal.SIGSTOP)
        wedged = timed(check, env, 3, timeout=60)
        audit_wedged = timed(["timeout", "10", "sh", str(audit)], env, 1, timeout=60)[0]
        os.kill(pid, signal.SIGCONT)
        w = max(wedged)
        bound = args.control_timeout + 0.5
        print(f"\nwedged (SIGSTOPped) daemon: worst of 3 {w:.2f} s; bound "
              f"control timeout + 0.5 = {bound:.1f} s: {'within' if w <= bound else 'OVER'}")
        print(f"  hand audit on the same wedged daemon: {audit_wedged:.1f} s "
              "(stopped by `timeout 10`; it has no bound of its own)")

        # Hand audit with slurmctld down: scontrol against a controller nobody serves.
        if shutil.which("scontrol"):
            conf = work / "slurm.conf"
            conf.write_text("ClusterName=bench\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                            "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                            "PartitionName=p Nodes=localhost Default=YES\n")
            down_env = dict(env, SLURM_CONF=str(conf), WITH_SCONTROL="1")
            down = timed(["sh", str(audit)], down_env, 1, timeout=120)[0]
            print(f"\nhand audit with slurmctld down: {down:.1f} s "
                  f"({down / base:.0f}x python3 -c pass); mps-health makes no Slurm call "
                  "unless a Slurm check is enabled, and bounds it when it does")
        else:
            print("\n(scontrol not installed: the slurmctld-down case is skipped)")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True,
                       capture_output=True, timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        if use_defaults:
            shutil.rmtree(pipe, ignore_errors=True)
            shutil.rmtree(log, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
