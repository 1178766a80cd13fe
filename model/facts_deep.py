"""Acquisition stage: the frozen facts of the deep checks (servers, logs, canary).

Apart from ``mps_health.model.facts`` so the core stays small; same rules. The state the
deep checks keep across runs (``previous``) is part of the facts: a check stays a pure
function of what was gathered, and a snapshot replays exactly what the run judged.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple


# --- servers -------------------------------------------------------------------------
class ClientFact(NamedTuple):
    """A client PID from ``get_client_list``, with what /proc says about it."""

    pid: int
    uid: Optional[int]  # None when the process is gone or unreadable
    user: Optional[str]
    start_ticks: Optional[int]
    # Read from /proc (mps_health.probes.clientinfo): all "" or None where unreadable.
    command: str = ""  # cmdline, NUL as spaces, cut: raw, escape before printing
    job_id: str = ""  # Slurm job id ("" when none was found)
    # "cgroup": in that job's Slurm cgroup (one naming no single job gives job_id "");
    # "environ": no Slurm cgroup, SLURM_JOB_ID names it (the user's claim, believed only
    # where squeue says the job is this uid's); "": none.
    job_from: str = ""
    # "read" | "truncated" (cut at the size cap) | "denied" (not root) | "gone" | "error"
    environ: str = ""
    thread_percentage: Optional[float] = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at exec
    pinned_mem_limit: str = ""  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT at exec, e.g. "0=2G"
    pipe_dir: Optional[str] = None  # CUDA_MPS_PIPE_DIRECTORY at exec (None: not set)
    # From ``ps``: GPUs (UUIDs cut to 22 characters) and PID namespace inode (containers).
    gpus: Tuple[str, ...] = ()
    namespace: str = ""


class DeviceFact(NamedTuple):
    """One GPU a server uses (``device_query``), with its limit and client contexts."""

    ordinal: int  # the server's device ordinal (the DEV of the control commands)
    uuid: str
    name: str
    pci: str
    pinned_mem_limit: str = ""  # get_device_pinned_mem_limit as printed ("4G"; "" none)
    pinned_mem_limit_bytes: Optional[int] = None
    contexts: Optional[int] = None  # client contexts on it (get_device_client_list)


class ServerFact(NamedTuple):
    """One MPS server from ``get_server_list`` and its ``get_server_status``."""

    pid: int
    # ACTIVE | INITIALIZING | FAULT; "gone": "Server PID not found"; "error": query failed.
    status: str
    detail: str
    uid: Optional[int]
    user: Optional[str]
    start_ticks: Optional[int]
    clients: Tuple[ClientFact, ...]
    # Asked only while the server runs; None/() when not answered.
    thread_percentage: Optional[float] = None
    devices: Tuple[DeviceFact, ...] = ()
    detail_errors: Tuple[str, ...] = ()  # "command: what went wrong", for the view


class InstanceServers(NamedTuple):
    """What one instance's control daemon said about its servers."""

    # "ok": asked; "idle": the daemon has no child (no server), nothing asked; else the
    # failed query's control status ("absent", "timeout", "error", "exec-failed", ...).
    query: str
    detail: str
    daemon_pid: Optional[int]
    daemon_start: Optional[int]
    servers: Tuple[ServerFact, ...]
    elapsed_s: float
    # get_default_device_pinned_mem_limit per ordinal ("" none), only while a server runs.
    default_pinned_mem_limits: Tuple[Tuple[int, str], ...] = ()
    # device_query's "Default" section, (ordinal, UUID): a limit's device ID is judged by
    # it (checks/limits.py).
    default_devices: Tuple[Tuple[int, str], ...] = ()


class RememberedServer(NamedTuple):
    pid: int
    start_ticks: int
    status: str
    status_since: float  # Unix time this status was first seen for this server
    user: str
    clients: Tuple[Tuple[int, int], ...]  # (pid, start ticks) of its clients
    # /proc showed it a child of the instance's real daemon when listed: what makes it
    # MPS's own (servertrack.remembered); a listing alone is whatever answers the socket.
    daemon_child: bool = False


class ServerEvent(NamedTuple):
    """Something seen between two runs (a restart, churn), reported for a window."""

    at: float
    code: str
    message: str


class ServerMemory(NamedTuple):
    """What the previous run saw of one instance (state_dir/servers.json)."""

    taken_at: float
    daemon_pid: Optional[int]
    daemon_start: Optional[int]
    servers: Tuple[RememberedServer, ...]
    events: Tuple[ServerEvent, ...] = ()


class PlannedRestart(NamedTuple):
    """A change of a control daemon mps-health made itself (``mps_health.hostio.planned``)."""

    pipe_dir: str
    at: float  # Unix time of the record
    daemon_pid: Optional[int] = None  # the daemon we started, where known
    daemon_start: Optional[int] = None  # its start time (clock ticks), with the pid
    by: str = ""  # "reset begin", "reset", "unit start", "unit stop", the Slurm hooks


class Ack(NamedTuple):
    """An operator's ``mps-health ack CODE [INSTANCE]`` (``mps_health.hostio.planned``)."""

    code: str  # an event code (servertrack.EVENT_CODES)
    instance: str  # "" for every instance
    at: float  # Unix time: the events of ``code`` up to then are acknowledged


class ServersFacts(NamedTuple):
    taken_at: float  # Unix time of this gathering: "now" for the check
    instances: Dict[str, InstanceServers]
    previous: Dict[str, ServerMemory]
    alive: Tuple[Tuple[int, int], ...]  # previous runs' clients (pid, start) still alive
    state_error: str = ""  # why the state could not be read or saved ("" when fine)
    # Daemon changes mps-health made itself (hostio/planned.py): not daemon-restarted.
    planned: Tuple[PlannedRestart, ...] = ()
    # Events an operator acknowledged (hostio/planned.py): not reported again.
    acks: Tuple[Ack, ...] = ()


# --- logs ----------------------------------------------------------------------------
# What the control daemon opens in its log dir itself, as its own user (driver 580).
LOG_FILES = ("control.log", "server.log")


class LogFinding(NamedTuple):
    """One notable log line (or group), kept with its own time for windowed reporting."""

    at: float  # Unix time from the line's timestamp
    code: str  # log-pending-client, log-server-exit, log-accept-failed, ...
    log_dir: str
    file: str  # "control.log" | "server.log"
    text: str  # the line's message, without the timestamp prefix
    pid: int = 0  # the client or server PID the line names (0: none)
    uid: int = -1  # the user the line names (-1: none)
    status: int = 0  # exit status for log-server-exit


class LogPosition(NamedTuple):
    """Where reading stopped in one log file: its identity and the next byte to read."""

    dev: int
    inode: int
    offset: int
    head: str = ""  # its first bytes (latin-1): a new file that reused the inode differs


class LogMemory(NamedTuple):
    """state_dir/logs.json: positions per file path, findings still in their window."""

    positions: Dict[str, LogPosition]
    findings: Tuple[LogFinding, ...]


class LogFileFact(NamedTuple):
    path: str  # as configured (log_dir/control.log)
    # "read" | "missing" | "error"; "bad": not the daemon's user's regular file (not
    # read); "foreign": another entry in the log dir, a link or another user's
    status: str
    detail: str = ""  # rotation, truncation, skipped bytes, the error, or what it is
    bytes_read: int = 0
    uid: int = -1  # the owner of a "bad" or "foreign" entry


class LogsFacts(NamedTuple):
    taken_at: float
    files: Tuple[LogFileFact, ...]
    findings: Tuple[LogFinding, ...]  # remembered (within the window) and new
    alive: Tuple[int, ...]  # PIDs of pending clients that still exist
    state_error: str = ""
    foreign: Tuple[LogFileFact, ...] = ()  # links and other users' entries in log dirs


# --- canary --------------------------------------------------------------------------
class CanaryFact(NamedTuple):
    """One run of the CUDA canary through one instance."""

    # "served": a server listed its PID while it held its context; "not-served": a context
    # but no server listed it (no MPS); "failed": a CUDA call failed; "timeout": no context
    # in time; "no-libcuda"; "skipped": another user's clients are connected (detail);
    # "not-run": our own lock was busy; "error": could not run, or said the unexpected.
    status: str
    detail: str
    uid: int  # the user it ran (or would have run) as
    pid: int = 0
    latency_s: Optional[float] = None  # cuInit to a usable context
    total_s: Optional[float] = None  # launch to exit, as the checker saw it
    server_pid: int = 0  # the server that listed it
    cuda_error: str = ""  # e.g. CUDA_ERROR_MPS_CONNECTION_FAILED (805) at cuCtxCreate
