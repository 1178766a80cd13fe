#!/usr/bin/env python3
"""Capture what slurmd gives the Prolog, TaskProlog and Epilog (the real Slurm fixture).

Run as root where slurm-wlm and munge are installed: ``python3 tests/helpers/capture_slurm_hook_env.py``.
It starts the test cluster with hooks that dump their environment and ``id``, runs an
mps:50 job, a gpu:1 job and a job without GRES as the test user, and writes
``tests/fixtures/slurm_hook_env__slurm-<version>_<hook>_<job>.txt``. Only variables
Slurm or the GPU plugin set are kept (SLURM_*, CUDA_*, GPU_*, ROCR_*, ZE_*, PATH, plus
the dumped uid line): the TaskProlog also inherits the submitter's whole environment.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from slurmcluster import SlurmCluster, ensure_user

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
KEEP = ("SLURM_", "CUDA_", "GPU_", "ROCR_", "ZE_", "PATH=")
DROP = ("SLURM_CONF=", "SLURM_SRUN_COMM_PORT=", "SLURM_STEP_LAUNCHER_PORT=",
        "SLURM_WORKING_CLUSTER=", "SLURM_TASK_PID=", "SLURM_SUBMIT_DIR=", "SLURM_JOB_WORK_DIR=")
DUMP = """#!/bin/sh
{ env | sort; echo "# id: $(id)"; } > {out}/{hook}.$SLURM_JOB_ID
"""


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="hookenv-", dir="/tmp"))
    base.chmod(0o755)
    out = base / "out"
    out.mkdir()
    out.chmod(0o777)
    hooks = {}
    for hook in ("prolog", "epilog", "task_prolog"):
        path = base / hook
        path.write_text(DUMP.replace("{out}", str(out)).replace("{hook}", hook))
        path.chmod(0o755)
        hooks[hook] = str(path)
    user = ensure_user().pw_name
    cluster = SlurmCluster(node_name="envnode", **hooks).start()
    try:
        version = cluster.run(["scontrol", "--version"]).stdout.split()[-1]
        short = ".".join(version.split(".")[:2])
        jobs = {}
        for label, gres in (("mps-50", ["--gres=mps:50"]), ("gpu-1", ["--gres=gpu:1"]),
                            ("no-gres", [])):
            r = cluster.run(["srun", *gres, "true"], user=user, timeout=60)
            if r.returncode != 0:
                raise SystemExit(f"srun {gres} failed: {r.stderr}")
            jobs[label] = gres
        time.sleep(3)  # the last epilog
    finally:
        cluster.stop()
    for number, label in enumerate(jobs, start=1):
        for hook in ("prolog", "task_prolog", "epilog"):
            src = out / f"{hook}.{number}"
            lines = [line for line in src.read_text().splitlines()
                     if (line.startswith(KEEP) or line.startswith("# id:"))
                     and not line.startswith(DROP)]
            dest = FIXTURES / f"slurm_hook_env__slurm-{short}_{hook}_{label}.txt"
            dest.write_text("\n".join(lines) + "\n")
            print(f"wrote {dest.name}")
    subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("run as root (slurmd and munged)")
    sys.exit(main())
