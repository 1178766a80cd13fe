#!/usr/bin/env python3
"""Capture real Slurm output from the test cluster into tests/fixtures (run as root).

    python3 tests/helpers/capture_slurm_fixtures.py            # this machine's Slurm (22.05)
    python3 tests/helpers/capture_slurm_fixtures.py --slurm24  # Slurm 24.11 in a Debian 13 root

Every file is named after the command and the Slurm version that printed it, e.g.
``scontrol_show_node_-d_-o__slurm-22.05_mps-job.txt``; the parser tests read them.
The cluster is the one of tests/helpers/slurmcluster.py (node mpsnode, Gres=gpu:2,mps:200).
Slurm 23.02 and later also give ``scontrol --json show node`` in the same states.
"""

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

sys.path.insert(0, str(Path(__file__).parent))
from mps_health.probes.slurm import SQUEUE_FORMAT
from slurmcluster import SlurmCluster, ensure_user
from slurmroot import SlurmRoot, make_root, remove_root

OUT = Path(__file__).resolve().parent.parent / "fixtures"


@contextlib.contextmanager
def slurm24_root() -> Iterator[SlurmRoot]:
    from debian_root import cache_dir

    dest = Path(tempfile.mkdtemp(prefix="debian13-slurm24-", dir="/var/tmp"))
    root = make_root(dest, cache_dir())
    try:
        yield root.start()
    finally:
        remove_root(root)


def main() -> int:
    if "--slurm24" in sys.argv[1:]:
        with slurm24_root() as root:
            return capture(root)
    return capture(None)


def capture(root: Optional[SlurmRoot]) -> int:
    user = ensure_user().pw_name
    with SlurmCluster(root=root) as c:
        version = c.run(["scontrol", "--version"]).stdout
        short = ".".join(version.split()[1].split(".")[:2])
        tag = f"slurm-{short}"
        has_json = tuple(int(x) for x in short.split(".")) >= (23, 2)

        def save(name: str, text: str) -> None:
            (OUT / name).write_text(text)
            print(f"{name}: {text.strip()[:100]}")

        def failed(name: str, r) -> None:  # a command that failed: keep what it printed
            assert r.returncode != 0, name
            for stream in ("stdout", "stderr"):
                text = getattr(r, stream)
                if text:
                    save(f"{name}.{stream}.txt", text)

        def node(label: str, plain: bool = False) -> None:
            save(f"scontrol_show_node_-d_-o__{tag}_{label}.txt", c.node_line() + "\n")
            if plain:  # what remediation reads: no -d
                save(f"scontrol_show_node_-o__{tag}_{label}.txt",
                     c.scontrol("show", "node", c.node_name, "-o"))
            if has_json:
                save(f"scontrol_--json_show_node__{tag}_{label}.json",
                     c.scontrol("--json", "show", "node", c.node_name))

        save(f"scontrol_--version__{tag}.txt", version)
        node("idle", plain=True)
        jobs = [c.start_job(["srun", "--gres=mps:50", "sleep", "120"])]
        c.wait_running(1)
        node("mps-job")
        jobs.append(c.start_job(["srun", "--gres=mps:30", "sleep", "120"], user=user))
        c.wait_running(2)  # one at a time: 22.05 may put gpu:1 on the mps GPU otherwise
        jobs.append(c.start_job(["srun", "--gres=gpu:1", "sleep", "120"]))
        c.wait_running(3)
        time.sleep(1.5)  # a non-zero time used in squeue
        node("mps-and-gpu-jobs")
        save(f"squeue_-h_-w_-o__{tag}_three-jobs.txt",
             c.run(["squeue", "-h", "-w", c.node_name, "-o", SQUEUE_FORMAT]).stdout)
        c.cancel_all()
        jobs.append(c.start_job(["srun", "--gres=gpu:2", "sleep", "120"]))
        c.wait_running(1)
        node("gpu2-job")
        c.cancel_all()
        c.wait_state(lambda s: s == "IDLE")
        c.scontrol("update", f"NodeName={c.node_name}", "State=DRAIN",
                   "Reason=MPS-HC: daemon-dead node: control daemon is not running")
        c.wait_state(lambda s: "DRAIN" in s)
        node("drained-by-mps-health", plain=True)
        c.scontrol("update", f"NodeName={c.node_name}", "State=RESUME")
        c.wait_state(lambda s: "DRAIN" not in s)
        node("resumed", plain=True)  # 24.11 keeps the last Reason; 22.05 clears it
        c.scontrol("update", f"NodeName={c.node_name}", "State=DOWN", "Reason=fan failure")
        c.wait_state(lambda s: s.startswith("DOWN"))
        node("down-by-admin", plain=True)
        c.scontrol("update", f"NodeName={c.node_name}", "State=RESUME")
        failed(f"scontrol_show_node_-d_-o__{tag}_not-found",
               c.run(["scontrol", "-d", "show", "node", "nosuchnode", "-o"]))
        failed(f"squeue_-h_-w_-o__{tag}_not-found",
               c.run(["squeue", "-h", "-w", "nosuchnode", "-o", SQUEUE_FORMAT]))
        if not has_json:
            failed(f"scontrol_--json_show_node__{tag}_unsupported",
                   c.run(["scontrol", "--json", "show", "node", c.node_name]))
        c.stop_controller()
        failed(f"scontrol_show_node_-d_-o__{tag}_controller-down",
               c.run(["scontrol", "-d", "show", "node", c.node_name, "-o"], timeout=60))
        for j in jobs:
            j.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
