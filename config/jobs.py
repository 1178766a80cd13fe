"""The ``jobs`` config section (per-job MPS life cycle): how the Prolog, TaskProlog and
Epilog behave (``mps`` gives them the layout and dir templates, ``commands`` the binary).
"""

from __future__ import annotations

from typing import Optional

from mps_health.config.schema import Record, Section, number, pathname, text


class JobsSettings(Record):
    # Which jobs get a daemon: "mps" only jobs with a gres/mps share (Slurm then sets
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the prolog); "gpu" every job holding GPUs.
    start_for: str = text("mps", choices=("mps", "gpu"))
    start_timeout_s: float = number(10.0, 0.5, 120.0)  # the daemon must answer within this
    quit_timeout_s: float = number(5.0, 0.0, 120.0)  # the epilog's `quit -t N`
    kill_grace_s: float = number(3.0, 0.1, 60.0)  # after SIGTERM, before SIGKILL, of leftovers
    # "fail": the prolog exits 1 when it cannot give an MPS job its daemon (Slurm drains
    # the node and requeues the job); "continue": log it, the job runs without MPS.
    on_start_failure: str = text("fail", choices=("fail", "continue"))
    log_file: Optional[str] = pathname(None, optional=True)  # also append hook log lines here


SECTION = Section("jobs", JobsSettings)
SECTIONS = (SECTION,)
jobs_settings = SECTION.of
