"""Helpers for the monitoring tests: the real tools, free ports, processes stopped by PID."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple, TypeVar

import pytest
from clirun import argv

T = TypeVar("T")


def need(tool: str) -> str:
    """The path of a Debian tool the tests drive for real (.ci/apt-packages installs it)."""
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin")
    if path is None:
        pytest.skip(f"{tool} is not installed (see .ci/apt-packages)")
    return path


def node_wide_check() -> str:
    """The check that reports daemons no configured instance uses: skipped where a test
    needs a clean OK, since other tests' fake daemons may run on the same machine."""
    from mps_health.engine import registry

    assert "strays" in registry.checks()
    return "strays"


def free_port() -> int:
    """A TCP port nobody listens on now, chosen by the kernel (so: at random)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> Tuple[int, str, str]:
    """(status, content type, body) of one HTTP GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def wait_for(what: str, probe: Callable[[], Optional[T]], timeout: float = 30.0,
             every: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout``."""
    end = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while time.monotonic() < end:
        try:
            value = probe()
            if value:
                return value
        except (OSError, ValueError) as e:
            last_error = e
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last error: {last_error})")


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, the process we started (by its PID, never by name)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def started(argv: List[str], log: Path, env: Optional[dict] = None
            ) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=env if env is not None else dict(os.environ))
    try:
        yield proc
    finally:
        stop(proc)


@contextlib.contextmanager
def exporter(tmp_path: Path, config: str, *args: str) -> Iterator[Tuple[subprocess.Popen, str]]:
    """``mps-health exporter`` on a free port: (process, base URL)."""
    log = tmp_path / "exporter.log"
    command = argv("mps-health", "exporter", "--config", config, "--listen", "127.0.0.1:0",
                   *args)
    with started(command, log) as proc:
        def announced() -> Optional[str]:
            if proc.poll() is not None:
                pytest.fail(f"exporter exited {proc.returncode}: {log.read_text()}")
            for line in log.read_text().splitlines():
                if "serving http://" in line:
                    return line.split("serving ", 1)[1].split("/metrics", 1)[0]
            return None

        yield proc, wait_for("the exporter to listen", announced)


def metric_lines(text: str, name: str) -> List[str]:
    """The sample lines of metric ``name`` (exactly that name, any labels)."""
    return [line for line in text.splitlines()
            if line.startswith((name + "{", name + " "))]
