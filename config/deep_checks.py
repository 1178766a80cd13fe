"""The config sections of the servers, logs, canary and clients facts.

Declared apart from the probes, so that validating a config file (every section, whatever
command runs) imports none of them; the probes read them with ``config.get(SERVERS)``.
"""

from __future__ import annotations

from typing import Optional

from mps_health.config.schema import Record, Section, custom, flag, number, text, user_name, whole


class ServersConfig(Record):
    init_stuck_s: float = number(60.0)  # INITIALIZING longer than this is stuck
    event_window_s: float = number(3600.0)  # restarts and churn stay reported this long


class LogsConfig(Record):
    window_s: float = number(900.0, low=0.001)  # a finding stays reported this long
    pending_warn_s: float = number(30.0, low=0.001)  # a client pending longer is reported
    max_read_bytes: int = whole(4 << 20, low=1)  # per file and run


class CanaryConfig(Record):
    timeout_s: float = number(10.0, low=0.5, high=120.0)  # one canary run, launch to exit
    user: str = custom("", user_name)  # run as: "" for the control daemon's user, or a name/uid
    device: int = whole(0)  # CUDA device ordinal, as the MPS server exposes them
    alloc_bytes: int = whole(1 << 20, low=1, high=1 << 30)
    # idle: only where Slurm says this node is IDLE and no MPS client is connected, killed
    # as soon as a job step starts here (probes/canary.py); not run on a node Slurm does not
    # know. always: whenever the check runs (still skipping others' clients). never: not run.
    when: str = text("idle", choices=("idle", "always", "never"))
    poll_s: float = number(0.1, low=0.01, high=5.0)  # how often the idle watch looks


class ClientsConfig(Record):
    """The ``clients`` section (checks/clients.py; docs/clients.md)."""

    # The MPS limit of client contexts per GPU on Volta and newer (NVIDIA's MPS guide).
    max_contexts_per_device: int = whole(48, low=1, high=1024)
    contexts_warn_ratio: float = number(0.9, low=0.01, high=1.0)  # clients-near-cap from here
    # server-spans-gpus: None = when mps.layout is per-gpu.
    per_gpu_isolation: Optional[bool] = flag(None, optional=True)


SERVERS = Section("servers", ServersConfig)
LOGS = Section("logs", LogsConfig)
CANARY = Section("canary", CanaryConfig)
CLIENTS = Section("clients", ClientsConfig)
SECTIONS = (SERVERS, LOGS, CANARY, CLIENTS)
