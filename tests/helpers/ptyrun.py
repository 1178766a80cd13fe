"""Run mps-health with a pty as its stdout or its stderr, as at a terminal."""

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
    its stdout (no COLUMNS, no NO_COLOR, TERM=xterm unless ``env`` says); its stderr must
    stay empty."""
    code, out, err = _run_on_pty(args, "stdout", columns, env)
    assert err == b""
    return code, out.decode().splitlines()


def stderr_on_pty(*args: str, columns: int = 80, env: Optional[Dict[str, str]] = None
                  ) -> Tuple[int, str]:
    """Exit code of ``mps-health args`` with a pty as its stderr (stdout left out), and
    what the terminal got."""
    code, said, _ = _run_on_pty(args, "stderr", columns, env)
    return code, said.decode("utf-8", "replace")


def _run_on_pty(args: Tuple[str, ...], stream: str, columns: int,
                env: Optional[Dict[str, str]]) -> Tuple[int, bytes, bytes]:
    """Exit code, what the pty got, and the other stream (stderr piped, stdout dropped)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # the lines as written, without the tty's \r
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    full.update({"TERM": "xterm", **(env or {})})
    on_stdout = stream == "stdout"
    try:
        proc = subprocess.Popen(argv("mps-health", *args), stdin=subprocess.DEVNULL,
                                stdout=slave if on_stdout else subprocess.DEVNULL,
                                stderr=subprocess.PIPE if on_stdout else slave, env=full)
    finally:
        os.close(slave)
    try:
        out = _read_until_closed(master, proc)
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    other = b""
    if proc.stderr is not None:
        other = proc.stderr.read()
        proc.stderr.close()
    return code, out, other


def _read_until_closed(master: int, proc: subprocess.Popen) -> bytes:
    """All the pty got until the child closed its side or ended (at most a minute)."""
    out = b""
    deadline = time.monotonic() + 60
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
    return out
