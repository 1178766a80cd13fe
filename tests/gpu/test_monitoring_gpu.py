"""Monitoring outputs on a real GPU: check_mps and the exporter against a real MPS daemon.

Run on the GPU node as root: ``python3 -m pytest -m gpu tests/gpu/test_monitoring_gpu.py -v -s``.
Each test starts its own control daemon on a private pipe dir under /tmp and quits it
afterwards; no GPU setting is changed. Everything seen is printed (``-s``) for
docs/gpu-validation.md: check_mps's output on each state, the textfile and a scrape.

With MPS_HEALTH_GPU_FAKE=1 (no GPU) the same steps run against tests/fakes' daemon,
skipping the CUDA client.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest
from clirun import argv, run
from mpsdaemon import quit_daemon, start_daemon
from mpsgpu import pythonpath, real_control
from nodesite import Site
from paths import FAKE_BIN, FAKE_CONTROL, FAKES

pytestmark = pytest.mark.gpu

FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"


REAL = shutil.which("nvidia-smi") is not None and real_control() is not None
if not (REAL or FAKE):
    pytest.skip("needs a GPU with the MPS binaries (or MPS_HEALTH_GPU_FAKE=1)",
                allow_module_level=True)


def importable(module: str, env: dict) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd="/",
                          capture_output=True, timeout=60).returncode == 0


def show(title: str, text: str) -> None:
    print(f"\n=== {title}\n{text.rstrip()}", flush=True)


class Node:
    """A private MPS instance: pipe and log dirs, a config, a daemon we start and quit."""

    def __init__(self) -> None:
        self.site = Site.create(prefix="mpsmon-")  # short: AF_UNIX
        self.base = self.site.root
        self.pipe, self.log = self.site.dirs()
        self.control = real_control() if REAL else FAKE_CONTROL
        self.config = Path(self.site.config(commands={"nvidia-cuda-mps-control": self.control},
                                            control={"timeout_s": 2.0}))
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
                        CUDA_MPS_LOG_DIRECTORY=str(self.log))
        if FAKE:
            self.env["PATH"] = os.pathsep.join((str(FAKE_BIN), str(FAKES), self.env["PATH"]))
        path = pythonpath()
        if path:
            self.env["PYTHONPATH"] = path
        self.daemon: Optional[int] = None

    def start(self) -> "Node":
        self.daemon = start_daemon(self.pipe, self.log, self.control, env=self.env)
        return self

    def quit(self) -> None:
        if self.daemon is None:
            return
        quit_daemon(self.pipe, self.daemon, self.control, env=self.env,
                    command="quit -t 5" if REAL else "quit")
        self.daemon = None

    def run(self, command: str, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        return run(command, *args, timeout=timeout, env=self.env, cwd="/")

    def check_mps(self, *args: str) -> subprocess.CompletedProcess:
        r = self.run("check_mps", "--config", str(self.config), *args)
        show(f"check_mps {' '.join(args)}   (exit {r.returncode})", r.stdout + r.stderr)
        return r


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    yield n.start()
    n.quit()
    n.site.close()


def perf(output: str, label: str) -> str:
    """The value of perfdata item ``label``: after the output's last '|' (the first line's
    end, or the last line with -v: nagiosplugin's layout)."""
    items = output.rsplit("|", 1)[1].split()
    return next(i.split("=", 1)[1].split(";")[0] for i in items if i.startswith(label + "="))


def cuda_client(env: dict) -> Optional[subprocess.Popen]:
    """A torch client holding a context through MPS, or None without torch/CUDA."""
    if FAKE:
        return None
    code = ("import sys, time, torch; x = torch.ones(1 << 20, device='cuda'); "
            "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "ready" not in line:
        proc.kill()
        proc.wait()
        show("CUDA client did not start (torch/CUDA unavailable?)", line)
        return None
    return proc


def test_check_mps_on_a_real_daemon(node: Node) -> None:
    r = node.check_mps("--only", "daemon,control,directories", "-v")
    # OK, or WARNING only for other tests' daemons still running beside ours.
    problems = [line for line in r.stdout.splitlines()[1:]
                if not line.startswith(("OK ", "| "))]  # -v: the perfdata is the last line
    assert all(p.startswith("WARNING daemon-unexpected:") for p in problems), r.stdout
    assert r.returncode == (1 if problems else 0), r.stdout
    assert perf(r.stdout, "node_daemon_up") == "1"
    latency = float(perf(r.stdout, "node_latency").rstrip("s"))
    assert latency < 0.5
    client = cuda_client(node.env)
    try:
        full = node.check_mps("-vv")  # every check, GPU ones included where merged
        assert full.returncode in (0, 1, 2) and full.stdout.startswith("MPS ")
    finally:
        if client is not None:
            client.kill()
            client.wait()


def test_check_mps_on_a_stopped_daemon_is_critical_within_t(node: Node) -> None:
    assert node.daemon is not None
    os.kill(node.daemon, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = node.check_mps("-t", "2", "-v")
        took = time.monotonic() - t0
    finally:
        os.kill(node.daemon, signal.SIGCONT)
    show("check_mps -t 2 on a stopped daemon took", f"{took:.2f}s")
    assert r.returncode == 2, r.stdout
    assert "control-wedged" in r.stdout and "daemon-stopped" in r.stdout


def test_exporter_textfile_and_scrape_on_a_real_daemon(node: Node) -> None:
    out = node.base / "textfile"
    out.mkdir()
    client = cuda_client(node.env)
    try:
        r = node.run("mps-health", "exporter", "--config", str(node.config),
                     "--textfile", str(out))
        assert r.returncode == 0, r.stderr
        text = (out / "mps_health.prom").read_text()
        show("mps-health exporter --textfile (mps_health.prom)", text)
        assert 'mps_health_daemon_up{mps_instance="node"} 1.0' in text
        assert "mps_health_control_latency_seconds{" in text and "process_" not in text
        promtool = shutil.which("promtool")
        if promtool:
            checked = subprocess.run([promtool, "check", "metrics"], input=text,
                                     capture_output=True, text=True, timeout=60)
            show("promtool check metrics", checked.stdout + checked.stderr)
            assert checked.returncode == 0
        log = node.base / "exporter.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                argv("mps-health", "exporter", "--config", str(node.config), "--listen",
                     "127.0.0.1:0", "--interval", "5"),
                env=node.env, cwd="/", stdout=f, stderr=subprocess.STDOUT)
        try:
            url = ""
            for _ in range(300):
                found = [line for line in log.read_text().splitlines() if "serving" in line]
                if found:
                    url = found[0].split("serving ", 1)[1].split(",", 1)[0]
                    break
                time.sleep(0.1)
            assert url, log.read_text()
            body = ""
            for _ in range(300):
                body = urllib.request.urlopen(url, timeout=10).read().decode()
                if "mps_health_last_run_timestamp_seconds" in body:
                    break
                time.sleep(0.1)
            show(f"scrape of {url}", body)
            assert 'mps_health_daemon_up{mps_instance="node"} 1.0' in body
            assert "process_resident_memory_bytes" in body
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        if client is not None:
            client.kill()
            client.wait()
