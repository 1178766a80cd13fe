"""Build --root fixture trees: /proc entries from captured files, pipe dirs with sockets.

Git cannot store sockets or FIFOs, so trees are made at test time from captured
/proc files (tests/fixtures/proc_*) and the pipe entries a running daemon makes (control,
control_privileged, control_lock, log, nvidia-cuda-mps-control.pid).
"""

import os
import socket
from pathlib import Path
from typing import Dict, Optional

from paths import FIXTURES

RUNNING_ENTRIES = ("control", "control_privileged", "control_lock", "log",
                   "nvidia-cuda-mps-control.pid")


def add_process(root: Path, pid: int, captured: str = "proc_fake-daemon", state: str = "S",
                uid: int = 0, pipe_dir: Optional[str] = None, role: str = "control",
                ppid: int = 1) -> None:
    """A /proc/PID entry made from a captured one, with pid/state/uid/env changed."""
    src = FIXTURES / captured
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    stat = (src / "stat").read_text()
    head, _, tail = stat.partition(") ")
    fields = tail.split(" ")
    fields[0], fields[1] = state, str(ppid)
    comm = head.split(" (", 1)[1]
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields))
    (d / "comm").write_text((src / "comm").read_text())
    status = (src / "status").read_text().splitlines()
    status = [f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" if s.startswith("Uid:") else s for s in status]
    (d / "status").write_text("\n".join(status) + "\n")
    # As the real ones were seen: a daemon keeps its -d, a server gets an empty argument.
    cmdline = {"control": b"nvidia-cuda-mps-control\0-d\0", "client": b"nvidia-cuda-mps-control\0",
               "server": b"nvidia-cuda-mps-server\0\0"}[role]
    (d / "cmdline").write_bytes(b"" if state == "Z" else cmdline)
    env: Dict[str, str] = {"PATH": "/usr/bin:/bin"}
    if pipe_dir is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def add_pipe_dir(root: Path, path: str, pid: Optional[int] = None, mode: int = 0o777,
                 entries: tuple = RUNNING_ENTRIES) -> Path:
    """A pipe dir as a running (or, without the pid, a cleanly quit) daemon leaves it."""
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    for name in entries:
        p = d / name
        if name.startswith("control") and name != "control_lock":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(p))
            s.close()  # the socket file stays, as after a SIGKILL
            os.chmod(p, 0o666 if name == "control" else 0o755)
        elif name == "log":
            os.mkfifo(p)
            os.chmod(p, 0o777)
        elif name == "nvidia-cuda-mps-control.pid":
            if pid is not None:
                p.write_text(str(pid))
        else:
            p.write_text("")
            os.chmod(p, 0o666)
    os.chmod(d, mode)
    return d


def add_dir(root: Path, path: str, mode: int = 0o755) -> Path:
    """A dir in the tree; by default as a log dir is (mps.log_dir_mode's default)."""
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, mode)
    return d
