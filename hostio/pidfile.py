"""The control daemon's pid file in a (world-writable) pipe dir: read it, never trust it.

Anyone may write in a 0777 pipe dir, so the file is read with ``safefiles.read_small``
(no link followed, a FIFO cannot block, at most a few bytes) and what it names is only a
candidate: ``processes.named_daemon`` checks /proc before anything acts on it.
"""

from __future__ import annotations

import os
from typing import Optional

PID_FILE = "nvidia-cuda-mps-control.pid"


def read_text(pipe_dir: str) -> Optional[str]:
    """The pid file's text, stripped; None if there is none we may read."""
    from mps_health.hostio.safefiles import read_small

    try:
        data = read_small(os.path.join(pipe_dir, PID_FILE), 64)
    except OSError:
        return None
    return None if data is None else data.decode("ascii", "replace").strip()


def read_pid(pipe_dir: str) -> Optional[int]:
    """The PID the pid file names; None if none or not a number."""
    text = read_text(pipe_dir)
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None
