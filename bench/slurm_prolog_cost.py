#!/usr/bin/env python3
"""What the per-job hooks cost a job, against baselines measured in the same run.

Every figure is a median over interleaved runs, printed with its ratio to a baseline,
so nothing depends on the machine's speed:

* `true` (a fork and exec) and `python3 -I -c pass` with the hooks' interpreter;
* a plain bash prolog, as sites write one (`su -` to start the job's daemon), for a
  job without GPUs (its `[ -z "$SLURM_JOB_GPUS" ]` exit);
* our Prolog, TaskProlog and Epilog for a job without GPUs (the fast path: no config
  read), and the Prolog for a whole-GPU job that gets no MPS (config read);
* our Prolog and Epilog for an MPS job (directories, daemon start as the job's user,
  first answer; then quit, verified cleanup), against that bash prolog and epilog
  doing the same with the same daemon.

The daemon is tests/fakes' fake, built by tests/helpers/fakebin.py with its client in C, so a
query costs what the real client costs. Needs root and the
test user (tests/helpers/slurmcluster.py's ensure_user creates it).

Usage: python3 bench/slurm_prolog_cost.py [--runs N]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))
from jobhooks import Site, user_python  # noqa: E402
from slurmcluster import ensure_user  # noqa: E402

BASH_PROLOG = """#!/bin/bash
# a plain bash /etc/slurm/prolog.d/mps_start (the control binary's path made absolute)
if [ -z "$SLURM_JOB_GPUS" ]; then
    exit 0
fi
MPS_DIR="{parent}/bash-mps_${{SLURM_JOB_ID}}"
MPS_LOG="{parent}/bash-log_${{SLURM_JOB_ID}}"
mkdir -p "$MPS_DIR" "$MPS_LOG"
chown -R "${{SLURM_JOB_UID}}:${{SLURM_JOB_GID}}" "$MPS_DIR" "$MPS_LOG"
export CUDA_VISIBLE_DEVICES=$SLURM_JOB_GPUS
su - "$SLURM_JOB_USER" -c "
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR; \\
    export CUDA_MPS_LOG_DIRECTORY=$MPS_LOG; \\
    export CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; \\
    {control} -d
"
exit 0
"""
BASH_EPILOG = """#!/bin/bash
MPS_DIR="{parent}/bash-mps_${{SLURM_JOB_ID}}"
if [ -d "$MPS_DIR" ]; then
    su - "$SLURM_JOB_USER" -c "
        export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR; \\
        echo quit | {control}
    "
    rm -rf "$MPS_DIR"
    rm -rf "{parent}/bash-log_${{SLURM_JOB_ID}}"
fi
exit 0
"""


def once(argv: List[str], env: Dict[str, str], user_kw: Optional[dict] = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, **(user_kw or {}))
    return time.perf_counter() - t0


def fast_client(work: Path) -> str:
    """The fake binaries with the client in C (tests/helpers/fakebin.py), in ``work/bin``."""
    from fakebin import install_fakes

    return str(install_fakes(work / "bin", fast_client=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    user = ensure_user().pw_name
    work = Path(tempfile.mkdtemp(prefix="mpsh-bench-", dir="/tmp"))
    work.chmod(0o755)
    python = user_python(work, user)
    if python is None:
        raise SystemExit(f"no Python that {user} can run imports mps_health")
    control = fast_client(work)
    site = Site(user, python, control=control)
    bash_prolog, bash_epilog = work / "bash_prolog", work / "bash_epilog"
    for path, text in ((bash_prolog, BASH_PROLOG), (bash_epilog, BASH_EPILOG)):
        path.write_text(text.format(parent=site.parent, control=control))
        path.chmod(0o755)
    r: Dict[str, List[float]] = {k: [] for k in (
        "true", "python", "bash-none", "prolog-none", "task-none", "epilog-none",
        "prolog-gpu", "prolog-mps", "epilog-mps", "bash-prolog-mps", "bash-epilog-mps")}
    try:
        job = 1000
        for _ in range(args.runs):  # interleaved, so drift hits every series alike
            none = site.env("prolog", "1", label="no-gres")
            r["true"].append(once(["true"], none))
            r["python"].append(once([python, "-I", "-c", "pass"], none))
            r["bash-none"].append(once([str(bash_prolog)], none))
            r["prolog-none"].append(once([str(site.hooks / "mps-health-prolog")], none))
            r["task-none"].append(once([str(site.hooks / "mps-health-task-prolog")],
                                       site.env("task-prolog", "1", label="no-gres")))
            r["epilog-none"].append(once([str(site.hooks / "mps-health-epilog")],
                                         site.env("epilog", "1", label="no-gres")))
            r["prolog-gpu"].append(once([str(site.hooks / "mps-health-prolog")],
                                        site.env("prolog", "2", label="gpu-1")))
            job += 1
            r["prolog-mps"].append(once([str(site.hooks / "mps-health-prolog")],
                                        site.env("prolog", str(job))))
            r["epilog-mps"].append(once([str(site.hooks / "mps-health-epilog")],
                                        site.env("epilog", str(job))))
            bash_env = dict(site.env("prolog", str(job)), PATH="/usr/sbin:/usr/bin:/sbin:/bin")
            r["bash-prolog-mps"].append(once([str(bash_prolog)], bash_env))
            time.sleep(0.2)  # the bash prolog returns before its daemon is up
            r["bash-epilog-mps"].append(once([str(bash_epilog)], bash_env))
        left = site.entries()
        med = {k: statistics.median(v) for k, v in r.items()}
        py, tr = med["python"], med["true"]

        def line(label: str, key: str, base: float, base_name: str) -> None:
            print(f"  {label:<44} {med[key] * 1000:8.1f} ms  {med[key] / base:6.2f}x {base_name}")

        print(f"median of {args.runs} runs (interpreter {python})")
        print(f"  {'true':<44} {tr * 1000:8.1f} ms")
        print(f"  {'python3 -I -c pass':<44} {py * 1000:8.1f} ms  (baseline)")
        print("job without GPUs (most jobs):")
        line("bash prolog", "bash-none", tr, "true")
        line("our Prolog (fast path)", "prolog-none", py, "python3 -I -c pass")
        line("our TaskProlog (fast path)", "task-none", py, "python3 -I -c pass")
        line("our Epilog (fast path)", "epilog-none", py, "python3 -I -c pass")
        print("whole-GPU job, no MPS (config read, nothing started):")
        line("our Prolog", "prolog-gpu", py, "python3 -I -c pass")
        print("MPS job (dirs, daemon as the job's user; then quit and cleanup):")
        line("our Prolog (until the daemon answers)", "prolog-mps", py, "python3 -I -c pass")
        line("our Epilog", "epilog-mps", py, "python3 -I -c pass")
        line("bash prolog (su -, returns before ready)", "bash-prolog-mps", py,
             "python3 -I -c pass")
        line("bash epilog (su -)", "bash-epilog-mps", py, "python3 -I -c pass")
        print(f"  ours/bash: prolog {med['prolog-mps'] / med['bash-prolog-mps']:.2f}, epilog "
              f"{med['epilog-mps'] / med['bash-epilog-mps']:.2f}")
        ours = [e for e in left if not e.startswith("bash-")]
        print(f"left in the parent dir after every run: ours {ours or 'nothing'}; "
              f"bash {len(left) - len(ours)} entries")
    finally:
        site.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
