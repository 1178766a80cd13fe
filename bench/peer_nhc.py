#!/usr/bin/env python3
"""`mps-health check` against LBNL NHC 1.4.3 running the MPS checks a site would write.

The peer is the tool a Slurm site already runs as HealthCheckProgram: LBNL NHC 1.4.3
(https://github.com/mej/nhc, tag 1.4.3), with three hand-written MPS checks in its
nhc.conf, as a site without mps-health writes them:

  * the control daemon runs, as root     check_ps_daemon nvidia-cuda-mps-control root
  * the pipe and log dirs are right      check_file_test -d, check_file_stat -m MODE -u 0
  * the daemon answers within 3 s        check_cmd_output -t 3 -r 0 /bin/sh -c
                                         "echo get_server_list | nvidia-cuda-mps-control"

On one fake node (tests/helpers/fakebin.py's binaries, the control client in C so that a query
costs what the real client costs; the daemon started through tests/helpers/mpsdaemon.py), in
ROUNDS interleaved rounds (the order turned each round, so drift and the machine's other
work hit every series alike):

  nhc         NHC 1.4.3: its own config, log and result file in a temp dir; marks nothing
              offline and calls no resource manager (NHC_RM, MARK_OFFLINE, ONLINE_NODE,
              OFFLINE_NODE given); its watchdog (30 s) and all its scripts loaded, as
              installed
  check       `mps-health check`, the default checks, with a config for the same node
  check_mps   the Nagios plugin with the same config

and prints the medians, the ratios check/nhc (goals: wall <= 0.6, CPU <= 1.0) and
check_mps/check (goal <= 1.2), with the quartiles of the per-round ratios. Then the daemon is stopped
(SIGSTOP): `mps-health check` must return within the control timeout + 0.5 s (PASS or
FAIL, worst of 3 runs); NHC's time on the same stopped daemon is printed beside it.
Ratios from one run, so the figures do not depend on the machine's speed; no test
asserts a time.

It runs as root (both tools do on a node) in a private PID and mount namespace, as
bench/check_speed.py does: empty file systems over /tmp, /run, /var/lib and /var/log, /etc
an overlay of its own, so the config is the default file /etc/mps-health/config.yaml, as
on a node (where /etc cannot be overlaid, it is given with --config, and the bench says
so); either way it is parsed on every run, as mps-health does; other processes on the
machine are not seen, and nothing of the host's is read or written. Not root, or no
unshare: one line says it skipped.

--procs N starts N idle processes first (in the namespace): a node's process table is
larger than an empty namespace's, and both NHC's `ps` parse and mps-health's /proc scan
grow with it.

Usage: python3 bench/peer_nhc.py --nhc DIR [--python PY] [--rounds N] [--procs N]
  DIR: a checkout of NHC 1.4.3 (git clone https://github.com/mej/nhc && git -C nhc
  checkout 1.4.3); it is run from a copy, never installed. Without --nhc the bench
  prints one line saying it skipped and exits 0.
  PY: the python of a venv with mps-health installed (not editable: an editable install
  adds its finder to every start); the commands are found in its bin/ (shutil.which).
  PY must not live under /tmp, /run, /var/lib or /var/log (hidden in the namespace).
Exit status: 0 when the wedged bound and both ratio goals hold (or when skipped), 1 when
one does not, 2 when the node could not be set up (one line says why).
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from _timing import run_timed

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))

NHC_VERSION = "1.4.3"
# What NHC needs from its tree: the driver and the check libraries it sources.
NHC_FILES = ("nhc", "scripts/common.nhc", "scripts/lbnl_cmd.nhc", "scripts/lbnl_file.nhc",
             "scripts/lbnl_ps.nhc")
CONTROL = "nvidia-cuda-mps-control"
QUERY_TIMEOUT_S = 3  # NHC's check_cmd_output -t: whole seconds
GOAL_CHECK_NHC = 0.6
GOAL_CHECK_NHC_CPU = 1.0
GOAL_PLUGIN_CHECK = 1.2
PRIVATE_DIRS = ("/tmp", "/run", "/var/lib", "/var/log")
DEFAULT_CONFIG = Path("/etc/mps-health/config.yaml")

NHC_CONF = """\
# The MPS checks a site writes in nhc.conf for a node-wide daemon (LBNL NHC 1.4.3).
# NHC runs with PATH=/sbin:/usr/sbin:/bin:/usr/bin and no CUDA_MPS_* variable.
* || export CUDA_MPS_PIPE_DIRECTORY={pipe}
# The bench's own line, not a site's: a failed run writes nothing to the host's syslog.
* || function logger() {{ cat >/dev/null; }}
* || check_ps_daemon {control} root
* || check_file_test -d {pipe} {log}
* || check_file_stat -m 0777 -u 0 {pipe}
* || check_file_stat -m 0755 -u 0 {log}
* || check_cmd_output -t {timeout} -r 0 /bin/sh -c "echo get_server_list | {client}"
"""


def skip(why: str) -> int:
    print(f"peer_nhc: skipped: {why}")
    return 0


def setup_failed(why: str) -> int:
    print(f"peer_nhc: cannot set up the node: {why}")
    return 2


def read_nhc(directory: Path) -> Tuple[Optional[Dict[str, Tuple[bytes, int]]], str]:
    """The NHC tree's driver and scripts/*.nhc by relative path (bytes, mode); or None
    and why it is not an NHC checkout. Read before the namespace hides /tmp."""
    missing = [name for name in NHC_FILES if not (directory / name).is_file()]
    if missing:
        return None, (f"{directory} is not an NHC checkout (no {missing[0]}): git clone "
                      "https://github.com/mej/nhc && git -C nhc checkout 1.4.3")
    files = {"nhc": ((directory / "nhc").read_bytes(), 0o755)}
    for script in sorted((directory / "scripts").glob("*.nhc")):
        files[f"scripts/{script.name}"] = (script.read_bytes(), 0o644)
    version = "unknown"
    configure = directory / "configure.ac"
    if configure.is_file():
        for line in configure.read_text(errors="replace").splitlines():
            if line.startswith("m4_define([nhc_version]"):
                version = line.split("[")[-1].split("]")[0]
    return files, version


def private_namespace() -> bool:
    """Re-run this bench in a PID and mount namespace of its own, as bench/check_speed.py
    does (the caller checked for root and unshare). True there when /etc is an overlay of
    its own, so the default config file may be written."""
    if os.environ.get("MPS_BENCH_PRIVATE") == "1":
        for d in PRIVATE_DIRS:
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True, timeout=30)
        for d in ("/tmp/.etc-upper", "/tmp/.etc-work"):
            os.mkdir(d)
        return subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                               "lowerdir=/etc,upperdir=/tmp/.etc-upper,workdir=/tmp/.etc-work",
                               "/etc"], capture_output=True, timeout=30).returncode == 0
    os.environ["MPS_BENCH_PRIVATE"] = "1"
    os.execvp("unshare", ["unshare", "--mount", "--pid", "--fork", "--mount-proc",
                          sys.executable, *sys.argv])
    return False  # not reached


# CPU seconds (user + system, with what each command waited for) by series: on a loaded
# machine wall times swing with the load, CPU time much less.
CPU: Dict[str, List[float]] = {}
# The exit status of each series' last run.
EXIT: Dict[str, int] = {}


def timed(name: str, argv: List[str], env: Dict[str, str], timeout: float = 60) -> float:
    """Wall seconds of one run (``_timing.run_timed``); its exit code and CPU time kept."""
    wall, EXIT[name], cpu = run_timed(argv, env, timeout)
    CPU.setdefault(name, []).append(cpu)
    return wall


def quartiles(num: List[float], den: List[float]) -> str:
    """The quartiles of the per-round ratios (both series ran in the same rounds)."""
    ratios = sorted(n / d for n, d in zip(num, den))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"per-round {q[0]:.2f}-{q[2]:.2f}"


def first_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stdout or "") + (proc.stderr or "")
    return (text.strip().splitlines() or ["(no output)"])[0][:160]


def command(name: str, bindir: Path) -> Optional[str]:
    """An installed command from PY's bin/ only (never this shell's PATH)."""
    return shutil.which(name, path=str(bindir))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Without --nhc: prints one line and exits 0 (skipped).")
    ap.add_argument("--nhc", type=Path, help="a checkout of LBNL NHC 1.4.3 (run from a copy)")
    ap.add_argument("--python", default=sys.executable,
                    help="python of a venv with mps-health installed (default: this one)")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    ap.add_argument("--procs", type=int, default=0,
                    help="idle processes started first, for a node's process table")
    ap.add_argument("--control-timeout", type=float, default=float(QUERY_TIMEOUT_S),
                    help="mps-health's control.timeout_s (default 3, NHC's query bound)")
    args = ap.parse_args()
    if args.nhc is None:
        return skip("no --nhc DIR (a checkout of LBNL NHC 1.4.3: git clone "
                    "https://github.com/mej/nhc && git -C nhc checkout 1.4.3)")
    if args.rounds < 1:
        return setup_failed("--rounds must be at least 1")
    nhc_files, nhc_version = read_nhc(args.nhc)
    if nhc_files is None:
        return skip(nhc_version)
    pybin = Path(args.python).parent
    entries = {name: command(name, pybin) for name in ("mps-health", "check_mps")}
    if None in entries.values():
        return setup_failed(f"{pybin} has no mps-health and check_mps: give --python the "
                            "python of a venv with mps-health installed")
    if any(Path(str(e)).resolve().is_relative_to(d) for e in entries.values() for d in PRIVATE_DIRS):
        return setup_failed(f"{pybin} lies under {', '.join(PRIVATE_DIRS)}, which the bench's "
                            "namespace hides: install mps-health elsewhere")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        # Both run as root on a node (HealthCheckProgram), and only a namespace of its own
        # keeps the machine's other processes and the host's state out of the figures.
        return skip("needs root and unshare (util-linux): the node runs in a private "
                    "PID and mount namespace")
    if nhc_version != NHC_VERSION:
        print(f"note: {args.nhc} is NHC {nhc_version}, not {NHC_VERSION}: not the documented peer")
    own_etc = private_namespace()
    from fakebin import FakeBinError, install_fakes
    from mpsdaemon import quit_daemon, start_daemon

    work = Path(tempfile.mkdtemp(prefix="mpsh-peer-nhc-"))
    work.chmod(0o755)
    idle: List[subprocess.Popen] = []
    pid = None
    wrote_default = False
    pipe, log, bindir = work / "pipe", work / "log", work / "bin"
    try:
        for d, mode in ((pipe, 0o777), (log, 0o755), (bindir, 0o755),
                        (work / "run", 0o755), (work / "state", 0o755)):
            d.mkdir()  # as the unit makes them
            d.chmod(mode)
        try:
            control = install_fakes(bindir, fast_client=True)
        except (FakeBinError, OSError, subprocess.SubprocessError) as e:
            return setup_failed(f"the fake MPS binaries: {e} (install gcc and python3-dev)")
        for rel, (data, mode) in nhc_files.items():
            (work / "nhc" / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / "nhc" / rel).write_bytes(data)
            (work / "nhc" / rel).chmod(mode)
        conf = work / "nhc.conf"
        conf.write_text(NHC_CONF.format(pipe=pipe, log=log, control=CONTROL, client=control,
                                        timeout=QUERY_TIMEOUT_S))
        # -n: NHC sources /etc/default/NAME (or /etc/sysconfig/NAME), so a host's own NHC
        # settings are not read; the variables keep it off the resource manager.
        nhc = ["/bin/bash", str(work / "nhc" / "nhc"), "-n", "mpsh-bench-nhc", "-c", str(conf),
               "-l", str(work / "nhc.log"), f"INCDIR={work / 'nhc' / 'scripts'}",
               f"RESULTFILE={work / 'nhc.status'}", "NHC_RM=bench", "MARK_OFFLINE=0",
               "ONLINE_NODE=:", "OFFLINE_NODE=:", "DETACHED_MODE=0", "TIMEOUT=30"]

        config = work / "config.yaml"
        config.write_text(f"run_dir: {work}/run\nstate_dir: {work}/state\nmps:\n"
                          f"  pipe_dir: {pipe}\n  log_dir: {log}\n  binary_dirs: [{bindir}]\n"
                          f"control:\n  timeout_s: {args.control_timeout}\n")
        given: List[str] = []
        wrote_default = own_etc and not DEFAULT_CONFIG.exists()
        if wrote_default:
            DEFAULT_CONFIG.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config, DEFAULT_CONFIG)
            where = f"the default file {DEFAULT_CONFIG} (parsed on every run, as on a node)"
        else:
            given = ["--config", str(config)]
            where = f"--config {config} (YAML parsed on every run)"
        check = [str(entries["mps-health"]), "check", *given]
        plugin = [str(entries["check_mps"]), *given]

        # A node's environment as slurmd gives it: no MPS variables, and Python's own
        # compiled-code cache on, as PYTHONDONTWRITEBYTECODE would stop.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CUDA_MPS_") and k != "PYTHONDONTWRITEBYTECODE"}
        for _ in range(args.procs):
            idle.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        pid = start_daemon(pipe, log, str(control))

        # Each once before it is measured, as on a node after its first run (Python's
        # compiled code written by then). Each must find the node
        # healthy, or the bench times a different path.
        series = {"nhc": nhc, "check": check, "check_mps": plugin}
        for name, argv in series.items():
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                detail = first_line(r)
                if name == "nhc":
                    detail = (work / "nhc.log").read_text(errors="replace")[-300:].strip()
                return setup_failed(f"{name} does not find the fake node healthy (exit "
                                    f"{r.returncode}): {detail}")
            print(f"{name}: exit 0: {first_line(r)}" if name != "nhc" else "nhc: exit 0")
        print(f"NHC {nhc_version} from {args.nhc}; mps-health from {pybin}; config: {where}; "
              f"{sum(1 for p in os.listdir('/proc') if p.isdigit())} processes seen; "
              f"{args.rounds} rounds")

        wall: Dict[str, List[float]] = {name: [] for name in series}
        order = list(series)
        for i in range(args.rounds):
            turned = order[i % len(order):] + order[:i % len(order)]
            for name in turned:
                wall[name].append(timed(name, series[name], env))
        med = {name: statistics.median(xs) for name, xs in wall.items()}
        cpu = {name: statistics.median(CPU[name]) for name in series}
        r_check = med["check"] / med["nhc"]
        r_plugin = med["check_mps"] / med["check"]
        print(f"\nhealthy node, median of {args.rounds} interleaved rounds (wall; CPU user+system):")
        for name, label in (("nhc", f"NHC {nhc_version}, 3 MPS checks"),
                            ("check", "mps-health check"), ("check_mps", "check_mps")):
            print(f"  {label:28} {med[name] * 1000:7.1f} ms   CPU {cpu[name] * 1000:6.1f} ms")
        r_cpu = cpu["check"] / cpu["nhc"]
        ok_check = r_check <= GOAL_CHECK_NHC and r_cpu <= GOAL_CHECK_NHC_CPU
        ok_plugin = r_plugin <= GOAL_PLUGIN_CHECK
        print(f"  check / NHC        {r_check:.2f}  (goal <= {GOAL_CHECK_NHC}: "
              f"{'within' if r_check <= GOAL_CHECK_NHC else 'OVER'}; "
              f"{quartiles(wall['check'], wall['nhc'])}; CPU {r_cpu:.2f}, goal <= "
              f"{GOAL_CHECK_NHC_CPU}: {'within' if r_cpu <= GOAL_CHECK_NHC_CPU else 'OVER'})")
        print(f"  check_mps / check  {r_plugin:.2f}  (goal <= {GOAL_PLUGIN_CHECK}: "
              f"{'within' if ok_plugin else 'OVER'}; "
              f"{quartiles(wall['check_mps'], wall['check'])}; "
              f"CPU {cpu['check_mps'] / cpu['check']:.2f})")

        # A wedged daemon: every client of a stopped daemon hangs.
        os.kill(pid, signal.SIGSTOP)
        try:
            wedged = max(timed("wedged", check, env) for _ in range(3))
            nhc_wedged = timed("nhc-wedged", nhc, env)
        finally:
            os.kill(pid, signal.SIGCONT)
        bound = args.control_timeout + 0.5
        ok_wedged = wedged <= bound
        print(f"\nwedged (SIGSTOPped) daemon: mps-health check worst of 3 {wedged:.2f} s "
              f"(exit {EXIT['wedged']}), bound control timeout + 0.5 = {bound:.2f} s: "
              f"{'PASS' if ok_wedged else 'FAIL'}")
        if nhc_wedged > QUERY_TIMEOUT_S + 1.5:
            why = (f"its -t {QUERY_TIMEOUT_S} ends the shell, not the client of the pipeline, "
                   "which holds the output open until NHC's own watchdog (TIMEOUT=30) ends "
                   "the run")
        else:
            why = f"check_cmd_output -t {QUERY_TIMEOUT_S}, counted in whole seconds"
        print(f"  NHC on the same daemon: {nhc_wedged:.2f} s, exit {EXIT['nhc-wedged']} ({why})")
        return 0 if ok_wedged and ok_check and ok_plugin else 1
    finally:
        if pid is not None:
            quit_daemon(pipe, pid, str(bindir / CONTROL))
        for p in idle:
            p.kill()
            p.wait()
        if wrote_default:
            DEFAULT_CONFIG.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
