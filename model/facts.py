"""Acquisition stage: the plain, frozen facts one run gathers (``mps_health.probes``).

Everything a check may look at is one of these NamedTuples, saved as-is in snapshots and
decoded from their field annotations (``model/codec.py``).
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple


class Instance(NamedTuple):
    """One MPS control daemon the site expects (or a per-job one found on disk)."""

    name: str  # "node", "gpu0", "job1234"
    layout: str  # "node" | "per-gpu" | "per-job"
    pipe_dir: str  # as configured (without --root)
    log_dir: str
    gpu: Optional[str] = None  # GPU index (or UUID) the instance serves
    job_id: Optional[str] = None


class ProcessFact(NamedTuple):
    """An nvidia-cuda-mps-* process seen in /proc."""

    pid: int
    ppid: int
    state: str  # one letter of /proc/PID/stat: R S D T t Z X ...
    uid: int
    # "control" (a daemon: started with -d or -f) | "client" | "server" | "unknown"
    role: str
    cmdline: Tuple[str, ...]
    start_ticks: int  # field 22 of stat: with the pid it names the process uniquely
    pipe_dir: Optional[str]  # CUDA_MPS_PIPE_DIRECTORY from environ; None when unreadable
    environ_readable: bool
    # /proc/PID/exe is its role's configured binary (probes.process_identity); None:
    # cannot be told (not root, a --root tree).
    genuine: Optional[bool] = None
    # TracerPid is not 0: held under ptrace (maybe at its exec), it proves nothing of MPS.
    traced: bool = False


class EntryFact(NamedTuple):
    """One entry inside a pipe directory, by lstat."""

    name: str
    kind: str  # "socket" | "fifo" | "file" | "dir" | "symlink" | "other"
    mode: int
    uid: int


class ParentFact(NamedTuple):
    """A parent of a pipe or log dir that other users cannot traverse (no o+x), by lstat."""

    path: str  # as configured (not under --root)
    mode: int
    uid: int


class DirFact(NamedTuple):
    """A pipe or log directory, by lstat (never followed)."""

    path: str
    kind: str  # "dir" | "symlink" | "file" | "other" | "missing" | "error"
    mode: int = 0
    uid: int = -1
    gid: int = -1
    owner: Optional[str] = None
    link_target: Optional[str] = None
    error: Optional[str] = None
    entries: Tuple[EntryFact, ...] = ()
    pid_file: Optional[str] = None  # content of nvidia-cuda-mps-control.pid, if any
    # Parents others cannot traverse (probes.dirs.blocked_parents; the dirs probe only)
    blocked: Tuple[ParentFact, ...] = ()


class ControlAnswer(NamedTuple):
    """The control daemon's answer to one command, through the real client."""

    command: str
    # "ok": rc 0 with output; "absent": rc 1 "Cannot find MPS control daemon process";
    # "error": anything else the client printed; "timeout": no answer in time (wedged);
    # "exec-failed": the client could not be started; "skipped": not asked.
    status: str
    rc: Optional[int]
    stdout: str
    stderr: str
    latency_s: float
    detail: str = ""


class TmpfilesRule(NamedTuple):
    """One line of a systemd-tmpfiles configuration file, as systemd would apply it."""

    file: str
    line: int
    type: str  # "x", "X", "d", "D", "q", "e", ...
    path: str
    age: str  # "-" when none


class TmpfilesFacts(NamedTuple):
    """The merged tmpfiles.d configuration (after /etc > /run > /usr/lib overrides)."""

    available: bool  # False when no tmpfiles.d directory exists (no systemd)
    files: Tuple[str, ...]
    rules: Tuple[TmpfilesRule, ...]
    errors: Tuple[str, ...] = ()


class Facts(NamedTuple):
    """Everything gathered in one run. ``sources`` maps a source name to its value."""

    node: str
    taken_at: float
    root: str
    instances: Tuple[Instance, ...]
    sources: Dict[str, object]
    errors: Dict[str, str]  # source name -> one line saying why it is missing
    durations: Dict[str, float]  # source name -> seconds spent gathering it
    # Per-job instances found beyond mps.max_instances: not judged this run.
    instances_over_cap: int = 0
    # (job id, why) of per-job instances not judged: MPS set up or torn down (jobphase).
    unjudged: Tuple[Tuple[str, str], ...] = ()

    def get(self, source: str) -> Any:
        """A gathered source's value (the engine runs a check only when it is there)."""
        return self.sources[source]
