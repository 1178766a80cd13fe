"""The Slurm jobs remediation needs to know about, in one bounded ``squeue`` call each.

``squeue --noheader --nodelist NODE --format '%A %U %T'`` lists the jobs Slurm has on
this node (id, uid, state). A failed or garbled answer is an error, never an empty
list: an empty list would make every per-job instance look orphaned.
"""

from typing import Dict, NamedTuple

from mps_health.config import Config
from mps_health.runner import run

FORMAT = "%A %U %T"


class SlurmError(Exception):
    """squeue failed or answered something we cannot read; the message says which."""


class Job(NamedTuple):
    job_id: str
    uid: int
    state: str


def parse_squeue(text: str) -> Dict[str, Job]:
    """Lines of '%A %U %T' -> {job id: Job}; ValueError names the first bad line."""
    jobs: Dict[str, Job] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
            raise ValueError(f"squeue line {number} is not 'JOBID UID STATE': {line[:80]!r}")
        jobs[fields[0]] = Job(fields[0], int(fields[1]), fields[2])
    return jobs


def jobs_on_node(config: Config, node: str, timeout_s: float) -> Dict[str, Job]:
    """Every job Slurm places on ``node``; SlurmError if that cannot be known."""
    argv = [config.command("squeue"), "--noheader", "--nodelist", node, "--format", FORMAT]
    done = run(argv, timeout_s)
    if done.exec_error:
        raise SlurmError(done.exec_error)
    if done.timed_out:
        raise SlurmError(f"squeue did not answer within {timeout_s:g}s")
    if done.rc != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.rc}")
        raise SlurmError(f"squeue failed: {why.splitlines()[0]}")
    try:
        return parse_squeue(done.stdout)
    except ValueError as e:
        raise SlurmError(str(e)) from None
