"""Run a command with a pty as its stdout, as at a terminal: its exit code and lines."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from typing import Dict, List, Optional, Tuple

from clirun import argv


def on_pty(*args: str, columns: int = 80, env: Optional[Dict[str, str]] = None
           ) -> Tuple[int, List[str]]:
    """Exit code and output lines of ``mps-health args`` with a pty ``columns`` wide as
    its stdout (no COLUMNS, no NO_COLOR, TERM=xterm unless ``env`` says)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # the lines as written, without the tty's \r
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    full.update({"TERM": "xterm", **(env or {})})
    try:
        proc = subprocess.Popen(argv("mps-health", *args), stdout=slave,
                                stderr=subprocess.PIPE, env=full)
    finally:
        os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert proc.stderr.read() == b""
    proc.stderr.close()
    return code, out.decode().splitlines()
