"""Who an MPS client is, and the per-server details the control client gives.

Pure parsers of what the real ``nvidia-cuda-mps-control`` prints (fixtures
``tests/fixtures/mps-control_*_clients.txt``), and capped O_NOFOLLOW|O_NONBLOCK reads of a
client's /proc files, its start time compared after them so a reused PID is never taken
for the client. All of it comes from users: kept raw, escaped where printed.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

ENVIRON_CAP = 256 * 1024  # bytes of /proc/PID/environ read at most
CMDLINE_CAP = 4096
CGROUP_CAP = 8192
COMMAND_KEEP = 200  # characters of the command line kept for the view

UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class ParseError(ValueError):
    pass


class PsRow(NamedTuple):
    pid: int
    context_id: str
    server: int
    device: str  # the GPU's UUID as ps prints it (cut to 22 characters)
    namespace: str
    command: str


class DeviceRow(NamedTuple):
    ordinal: int
    pci: str
    uuid: str
    name: str


class ClientProc(NamedTuple):
    """What /proc says about one client (see ClientFact for the meaning of each field)."""

    command: str = ""
    job_id: str = ""
    job_from: str = ""
    environ: str = ""
    thread_percentage: Optional[float] = None
    pinned_mem_limit: str = ""
    pipe_dir: Optional[str] = None


def parse_ps(text: str) -> Tuple[PsRow, ...]:
    """``ps``: a header ``PID ID SERVER DEVICE NAMESPACE COMMAND`` and one row a client;
    ``Server not found`` when no server runs. The command (last) may hold spaces."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].strip() == "Server not found":
        return ()
    if lines[0].split() != ["PID", "ID", "SERVER", "DEVICE", "NAMESPACE", "COMMAND"]:
        raise ParseError(f"ps: unexpected header {lines[0].strip()[:80]!r}")
    rows = []
    for line in lines[1:]:
        parts = line.split(None, 5)
        if len(parts) < 5 or not parts[0].isdigit() or not parts[2].isdigit():
            raise ParseError(f"ps: unexpected row {line.strip()[:80]!r}")
        rows.append(PsRow(int(parts[0]), parts[1], int(parts[2]), parts[3], parts[4],
                          parts[5].strip() if len(parts) > 5 else ""))
    return tuple(rows)


def first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].strip()


def parse_percentage(text: str) -> float:
    """``get_active_thread_percentage PID``: ``60.0``."""
    first = first_line(text)
    try:
        value = float(first)
    except ValueError:
        raise ParseError(f"expected a percentage, got {first[:60]!r}") from None
    if not 0.0 <= value <= 100.0:
        raise ParseError(f"percentage {value} out of 0..100")
    return value


def parse_mem_limit(text: str) -> Tuple[str, Optional[int]]:
    """``get_(default_)device_pinned_mem_limit``: ``4G`` (whole units: the daemon keeps
    ``1500M`` as ``1G``); empty output when no limit is set. (text, bytes or None)."""
    first = first_line(text)
    if not first:
        return "", None
    if first.endswith("not found") or " " in first:
        raise ParseError(f"expected a memory limit, got {first[:60]!r}")
    return first, mem_bytes(first)


def mem_bytes(value: str) -> Optional[int]:
    """``4G`` -> bytes; None when it is no size (the raw text is kept by the caller)."""
    m = re.fullmatch(r"([0-9]+)([KMGT]?)B?", value.strip().upper())
    return int(m[1]) * UNITS[m[2]] if m else None


def parse_device_query(text: str) -> Dict[str, Tuple[DeviceRow, ...]]:
    """``device_query``: sections ``Default`` and ``Server PID``, each a table
    ``Device Ordinal  PCI IDs  UUID  Name  Attributes``. Keyed "default" / "PID"."""
    out: Dict[str, List[DeviceRow]] = {}
    section: Optional[str] = None
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("Device Ordinal"):
            continue
        if s == "Default":
            section = "default"
        elif s.startswith("Server ") and s[7:].strip().isdigit():
            section = s[7:].strip()
        elif section is not None and s.split(None, 1)[0].isdigit():
            parts = s.split()
            if len(parts) < 4 or not parts[2].startswith(("GPU-", "MIG-")):
                raise ParseError(f"device_query: unexpected row {s[:80]!r}")
            # The name holds spaces; the last column (Attributes) does not.
            name = " ".join(parts[3:-1]) if len(parts) > 4 else parts[3]
            out.setdefault(section, []).append(DeviceRow(int(parts[0]), parts[1], parts[2],
                                                         name))
        else:
            raise ParseError(f"device_query: unexpected line {s[:80]!r}")
    return {k: tuple(v) for k, v in out.items()}


def parse_device_clients(text: str) -> Dict[int, int]:
    """``get_device_client_list PID``: ``[0] 00:00.0, NVIDIA H200`` (the device ordinal
    in brackets) then one ``PID.CONTEXT`` line per client context: contexts per ordinal."""
    counts: Dict[int, int] = {}
    device: Optional[int] = None
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("[") and "]" in s and s[1:s.index("]")].isdigit():
            device = int(s[1:s.index("]")])
            counts.setdefault(device, 0)
        elif device is not None and s.replace(".", "", 1).isdigit():
            counts[device] += 1
        elif s.endswith("not found"):
            return {}
        else:
            raise ParseError(f"get_device_client_list: unexpected line {s[:80]!r}")
    return counts


def _number(text: str) -> Optional[str]:
    """``text`` if it is a number as Slurm's ``%u`` prints it (ASCII digits, no sign, no
    leading zero, at most 10 digits: a job id and a uid are uint32), else None."""
    if not 0 < len(text) <= 10 or not text.isascii() or not text.isdigit():
        return None
    return text if text == "0" or text[0] != "0" else None


def job_of_cgroup_path(path: str) -> Optional[str]:
    """The Slurm job whose cgroup ``path`` is, or None. Only the places Slurm makes
    (22.05 to 24.11): v2 ``/system.slice/slurmstepd.scope/job_N[/step_S/...]``;
    v1 ``/slurm/uid_U/job_N[/step_S/...]`` (``/slurm_NODENAME/...`` with several slurmd)."""
    parts = path.split("/")
    if len(parts) < 4 or parts[0] != "":
        return None
    top, second, name = parts[1:4]
    # slurmd's scope under system.slice (NODENAME_slurmstepd.scope with several slurmd
    # per host): only root can make a dir there, while a user's own delegated cgroup tree
    # (user.slice/.../user@UID.service) may hold any names, so the place is checked too.
    v2 = top == "system.slice" and (second == "slurmstepd.scope" or (
        second.endswith("_slurmstepd.scope") and len(second) > len("_slurmstepd.scope")))
    v1 = (top == "slurm" or (top.startswith("slurm_") and len(top) > 6)) \
        and second.startswith("uid_") and _number(second[4:]) is not None
    if not (v1 or v2):
        return None
    job = _number(name[4:]) if name.startswith("job_") else None
    if job == "0" or (len(parts) > 4 and not parts[4].startswith("step_")):
        return None  # below a job, Slurm makes step_* only
    return job


def parse_cgroup(text: str, truncated: bool = False) -> Tuple[str, bool]:
    """(Slurm job id, whether any line is a Slurm job cgroup) of ``/proc/PID/cgroup``
    (``ID:CONTROLLERS:PATH`` lines). Whoever may create cgroups names them, so another
    line is skipped, a cut last line dropped, and lines naming different jobs give no job
    (yet count as a Slurm cgroup: the environment is then not asked)."""
    lines = text.split("\n")[:-1] if truncated else text.split("\n")
    found: Optional[str] = None
    slurm = False
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3 or _number(fields[0]) is None:
            continue
        job = job_of_cgroup_path(fields[2])
        if job is None:
            continue
        if found is not None and job != found:
            return "", True
        found, slurm = job, True
    return found or "", slurm


def interpret(environ: Dict[str, str], status: str, cmdline: bytes, cgroup: str,
              cgroup_truncated: bool = False) -> ClientProc:
    """A ClientProc from the parts read (pure). The job is the Slurm job cgroup (its user
    cannot move it into another user's job); ``SLURM_JOB_ID`` is the user's say-so, taken
    only outside any Slurm cgroup, marked "environ", and believed only where squeue says
    the job is the process's uid's (``mps_health.checks.clients.attribute``)."""
    args = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a]
    command = " ".join(args)[:COMMAND_KEEP]
    job, in_slurm = parse_cgroup(cgroup, cgroup_truncated)
    job_from = "cgroup"
    claimed = environ.get("SLURM_JOB_ID", "")  # as Slurm sets it: digits alone
    if not in_slurm and _number(claimed) not in (None, "0"):
        job, job_from = claimed, "environ"
    try:  # the daemon's own rule for a percentage: a number in 0..100
        pct: Optional[float] = parse_percentage(
            environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""))
    except ParseError:
        pct = None
    return ClientProc(command, job, job_from if job else "", status, pct,
                      environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")[:100],
                      environ.get("CUDA_MPS_PIPE_DIRECTORY"))


def _read_capped(path: str, cap: int) -> Tuple[Optional[bytes], str]:
    """(up to ``cap`` bytes, status): "read", "truncated", "denied", "gone", "error"."""
    from mps_health.hostio.safefiles import open_regular, read_upto

    try:
        fd, _st = open_regular(path)
        try:
            data = read_upto(fd, cap)
        finally:
            os.close(fd)
    except PermissionError:
        return None, "denied"
    except (FileNotFoundError, ProcessLookupError):
        return None, "gone"
    except OSError:
        return None, "error"
    return data[:cap], "truncated" if len(data) > cap else "read"


def read_client(proc_dir: str, pid: int, start_ticks: Optional[int]) -> ClientProc:
    """What /proc says about client ``pid`` (started at ``start_ticks``); never raises."""
    from mps_health.probes.proc import identity, parse_environ

    base = f"{proc_dir}/{pid}"
    cmdline, _ = _read_capped(f"{base}/cmdline", CMDLINE_CAP)
    cgroup, cgroup_status = _read_capped(f"{base}/cgroup", CGROUP_CAP)
    raw, status = _read_capped(f"{base}/environ", ENVIRON_CAP)
    after = identity(proc_dir, pid)
    if after is None or (start_ticks is not None and after[1] != start_ticks):
        return ClientProc(environ="gone")  # exited (or the PID was reused) meanwhile
    env = parse_environ(raw, status == "truncated") if raw is not None else {}
    return interpret(env, status, cmdline or b"", (cgroup or b"").decode("utf-8", "replace"),
                     cgroup_status == "truncated")
