#!/usr/bin/env python3
"""Who is on MPS, for real: clients of two users and four jobs through one node-wide daemon.

    python3 tests/gpu/clients_scenario.py OUTDIR      (as root, on the GPU node)

Runs in a private mount namespace with a fresh tmpfs on /tmp/nvidia-mps, so the node-wide daemon can
use the default pipe dir /tmp/nvidia-mps exactly as a site's would, and a CUDA client
without any CUDA_MPS_* variable is captured by it as on a real mixed node, without
touching the machine's own pipe dir. The daemon gets a default active thread percentage of
60 and a default pinned memory limit; then, as user ``mpsh-alice``:

* job 101 (asked ``--gres=mps:30``): ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30``;
* job 102 (asked ``mps:50``, its script raised the variable): ``=100`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G``;
* job 103 (asked ``gpu:1``, no MPS): no CUDA_MPS_* at all, captured by the daemon;
* job 104 (asked ``mps:20``): started with ``=20``, but the program sets it to 100 in its
  own environment before CUDA starts (what /proc cannot see);

then user ``mpsh-bob``, job 201 (``mps:50``, ``=50``), who waits while alice's server
runs and is served by a server of his own once alice's clients exit.

Each client prints what CUDA gave it (SMs, memory); the raw answers of the control
client, NVML's process lists, the clients' /proc files and ``mps-health clients``/``check``
(with ``OUTDIR/squeue`` standing in for squeue, printing these jobs in squeue's format)
are written to OUTDIR. Never changes the card's settings; the daemon is always quit.
"""

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

FAKES = Path(__file__).resolve().parent.parent / "fakes"
# --fake: the fake daemon and a client without CUDA (it joins through fake_client_connect),
# to exercise this script on a machine without a GPU before the one real run.
FAKE = "--fake" in sys.argv
if FAKE:  # the fake as an executable, as mps-health judges binaries (tests/helpers/fakebin.py)
    sys.path.insert(0, str(FAKES.parent / "helpers"))
    from fakebin import fake_bin
CONTROL = str(fake_bin() / "nvidia-cuda-mps-control") if FAKE else (
    shutil.which("nvidia-cuda-mps-control") or "/usr/local/nvidia/bin/nvidia-cuda-mps-control")
USERS = ("mpsh-alice", "mpsh-bob")
WORK = Path("/tmp/mpsh-clients-work")
LOG_DIR = str(WORK / "log")

CLIENT = r"""
import json, os, sys, time
if sys.argv[2] != "-":
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = sys.argv[2]  # after exec: not in /proc
if sys.argv[3] == "fake":
    print(json.dumps({"pid": os.getpid(), "sms": None}), flush=True)
else:
    import torch
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    x = torch.ones(64 * 1024 * 1024, device="cuda")  # 256 MiB
    torch.cuda.synchronize()
    print(json.dumps({"pid": os.getpid(), "sms": props.multi_processor_count,
                      "free_bytes": free, "total_bytes": total,
                      "allocated_bytes": torch.cuda.memory_allocated()}), flush=True)
sys.stdin.readline()  # the scenario closes stdin: a clean exit, as a job's end
"""

# (name, user, job id, gres the job asked, CUDA_MPS_* in its environ, set inside)
CLIENTS = [
    ("job101", "mpsh-alice", "101", "gres:mps:30", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}, "-"),
    ("job102", "mpsh-alice", "102", "gres:mps:50",
     {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}, "-"),
    ("job103", "mpsh-alice", "103", "gres:gpu:1", {}, "-"),
    ("job104", "mpsh-alice", "104", "gres:mps:20", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"},
     "100"),
    ("job201", "mpsh-bob", "201", "gres:mps:50", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, "-"),
    # Started after the server's percentage was lowered to 50: what a new client gets.
    ("job105", "mpsh-alice", "105", "gres:mps:50", {}, "-"),
]


class Scenario:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.transcript: List[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        self.env["CUDA_MPS_LOG_DIRECTORY"] = LOG_DIR
        self.procs: Dict[str, subprocess.Popen] = {}
        self.ready: Dict[str, dict] = {}
        self.fake_pending: Dict[str, tuple] = {}
        self.tag = ""
        self.results: Dict[str, dict] = {"views": {}, "checks": {}}

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.transcript.append(text)

    def ask(self, command: str) -> str:
        t0 = time.monotonic()
        argv = [CONTROL]
        r = subprocess.run(argv, input=command + "\n", env=self.env, capture_output=True,
                           text=True, timeout=20)
        took = time.monotonic() - t0
        self.note(f"$ echo {command} | nvidia-cuda-mps-control   (rc {r.returncode}, "
                  f"{took * 1000:.1f} ms)\n{r.stdout}{r.stderr}".rstrip())
        return r.stdout

    def start_daemon(self) -> None:
        argv = [CONTROL, "-d"]
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        self.note(f"$ nvidia-cuda-mps-control -d   (rc {r.returncode}) {r.stdout}{r.stderr}")
        for _ in range(500):
            if Path("/tmp/nvidia-mps/nvidia-cuda-mps-control.pid").exists():
                break
            time.sleep(0.01)

    def start_client(self, spec: tuple) -> None:
        name, user, job, _gres, mps_env, inside = spec
        env = {k: v for k, v in self.env.items() if k != "CUDA_MPS_LOG_DIRECTORY"}
        env.update(mps_env, SLURM_JOB_ID=job, SLURM_JOB_USER=user, HOME=str(WORK),
                   CUDA_VISIBLE_DEVICES="0")
        # The node's python3 holds torch on the GPU machine; a venv under /root would not
        # be readable by the users, so the fake client takes the system's.
        python = "/usr/bin/python3" if FAKE else sys.executable
        argv = ["runuser", "-u", user, "--", python, str(WORK / "client.py"), name,
                inside, "fake" if FAKE else "cuda"]
        self.procs[name] = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, start_new_session=True)
        self.note(f"started {name} as {user}: SLURM_JOB_ID={job} {mps_env} "
                  f"(inside: {inside})")

    def wait_ready(self, name: str, timeout: float) -> Optional[dict]:
        import select

        proc = self.procs[name]
        assert proc.stdout is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                info = json.loads(line)
                if FAKE:  # what CUDA does through MPS: join the server of its user
                    uid = pwd.getpwnam(next(c[1] for c in CLIENTS if c[0] == name)).pw_uid
                    said = self.ask(f"fake_client_connect {info['pid']} {uid}").strip()
                    if said == "pending":
                        self.fake_pending[name] = (info, uid)
                        continue
                self.ready[name] = info
                self.note(f"{name} ready: {line.strip()}")
                return self.ready[name]
            if name in self.fake_pending:
                info, uid = self.fake_pending[name]
                if self.ask(f"fake_client_connect {info['pid']} {uid}").strip() != "pending":
                    del self.fake_pending[name]
                    self.ready[name] = info
                    self.note(f"{name} ready: {json.dumps(info)}")
                    return info
        self.note(f"{name}: not ready within {timeout:.0f}s")
        return None

    def stop_client(self, name: str) -> None:
        proc = self.procs.pop(name)
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the session we started, by its id
            proc.wait(timeout=30)
        err = proc.stderr.read() if proc.stderr else ""
        self.note(f"{name} exited rc {proc.returncode} {err.strip()[-300:]}")

    def client_pid(self, name: str) -> Optional[int]:
        info = self.ready.get(name)
        return int(info["pid"]) if info else None

    def record_proc(self, label: str, pid: int) -> None:
        lines = [f"--- /proc/{pid} ({label})"]
        for part in ("cmdline", "cgroup", "environ"):
            try:
                data = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError as e:
                lines.append(f"{part}: {e}")
                continue
            if part == "environ":
                keep = [e.decode() for e in data.split(b"\0")
                        if e.startswith((b"CUDA_", b"SLURM_"))]
                lines.append(f"environ ({len(data)} bytes): {keep}")
            else:
                lines.append(f"{part}: {data!r}")
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            lines += [ln for ln in status.splitlines() if ln.startswith(("Uid:", "NSpid:"))]
            lines.append(f"pid ns: {os.readlink(f'/proc/{pid}/ns/pid')}")
        except OSError as e:
            lines.append(f"status: {e}")
        self.note("\n".join(lines))

    def nvml(self) -> None:
        if FAKE:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            for fn in ("nvmlDeviceGetComputeRunningProcesses",
                       "nvmlDeviceGetMPSComputeRunningProcesses"):
                procs = getattr(pynvml, fn)(h)
                self.note(f"NVML {fn}: " + json.dumps(
                    [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in procs]))
            self.note(f"NVML uuid: {pynvml.nvmlDeviceGetUUID(h)}")
            pynvml.nvmlShutdown()
            from mps_health.probes.nvml import PynvmlApi, record

            data = record(PynvmlApi())
            data["note"] = f"recorded by tests/gpu/clients_scenario.py ({self.tag})"
            (self.out / f"nvml_record_{self.tag}.json").write_text(json.dumps(data, indent=1))
        except Exception as e:  # a capture: say what failed and go on
            self.note(f"NVML: {type(e).__name__}: {e}")

    def snapshot(self, tag: str) -> None:
        """Every question the control client takes about what runs now."""
        self.tag = tag
        self.note(f"\n===== {tag}")
        servers = self.ask("get_server_list").split()
        for s in servers:
            for q in ("get_server_status", "get_client_list", "get_active_thread_percentage",
                      "get_device_client_list"):
                self.ask(f"{q} {s}")
            self.ask(f"get_device_pinned_mem_limit {s} 0")
            self.record_proc(f"server {s}", int(s))
        self.ask("get_device_client_list")
        self.ask("ps")
        self.ask("get_default_active_thread_percentage")
        self.ask("get_default_device_pinned_mem_limit 0")
        self.nvml()
        if not FAKE:
            r = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
            self.note("$ nvidia-smi\n" + r.stdout[-2500:])
        for name in sorted(self.ready):
            pid = self.client_pid(name)
            if pid and name in self.procs:
                self.record_proc(name, pid)
        self.mps_health(tag)

    def mps_health(self, tag: str) -> None:
        config = WORK / "config.yaml"
        runs = (("clients", ["clients"]), ("clients-json", ["clients", "--format", "json"]),
                ("check", ["check", "-v"]), ("check-json", ["check", "--format", "json"]),
                ("snapshot", ["snapshot", "--all", "-o", str(self.out / f"snapshot_{tag}.json")]))
        for label, args in runs:
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "mps_health.cli.main", *args, "--config",
                                str(config)], capture_output=True, text=True, timeout=60,
                               env=self.env, cwd="/")
            took = time.monotonic() - t0
            self.note(f"$ mps-health {' '.join(args)}   (rc {r.returncode}, {took:.2f}s)\n"
                      f"{r.stdout}{r.stderr}".rstrip())
            (self.out / f"mps-health_{label}_{tag}.txt").write_text(r.stdout + r.stderr)
            if label.endswith("-json"):
                try:
                    data = json.loads(r.stdout)
                except ValueError:
                    data = {"unparsed": r.stdout + r.stderr}
                kind = "views" if label.startswith("clients") else "checks"
                self.results[kind][tag] = dict(data, rc=r.returncode, seconds=took)

    def run(self) -> int:
        self.note(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {os.uname()}")
        if not FAKE:
            r = subprocess.run([CONTROL, "-h"], capture_output=True, text=True, timeout=20)
            self.note(f"$ nvidia-cuda-mps-control -h   (rc {r.returncode})\n{r.stdout}{r.stderr}")
        self.start_daemon()
        self.ask("get_server_list")
        self.ask("ps")
        self.ask("device_query")
        self.ask("get_default_device_pinned_mem_limit 0")
        self.ask("get_active_thread_percentage 1")
        self.ask("get_device_pinned_mem_limit 1 0")
        self.ask("get_device_client_list")
        self.ask("set_default_active_thread_percentage 60")
        self.ask("set_default_device_pinned_mem_limit 0 1500M")
        self.ask("get_default_device_pinned_mem_limit 0")
        self.ask("set_default_device_pinned_mem_limit 0 4G")
        self.ask("get_default_device_pinned_mem_limit 0")
        self.ask("get_default_device_pinned_mem_limit 1")
        for spec in CLIENTS[:4]:
            self.start_client(spec)
        for spec in CLIENTS[:4]:
            self.wait_ready(spec[0], 180)
        self.ask("device_query")
        self.snapshot("alice")
        servers = self.ask("get_server_list").split()
        if servers:
            # The server's percentage, not the default, is what new clients get.
            self.ask(f"set_active_thread_percentage {servers[0]} 50")
            self.ask(f"get_active_thread_percentage {servers[0]}")
            self.ask("get_default_active_thread_percentage")
            self.start_client(CLIENTS[5])
            self.wait_ready("job105", 180)
            self.ask(f"set_active_thread_percentage {servers[0]} 60")
            self.ask(f"get_active_thread_percentage {servers[0]}")
            self.stop_client("job105")
        self.start_client(CLIENTS[4])
        if self.wait_ready("job201", 8) is None:
            self.ask("get_server_list")
            self.ask("ps")
            self.note("--- control.log (tail)\n" + tail(Path(LOG_DIR, "control.log"), 15))
        for spec in CLIENTS[:4]:
            self.stop_client(spec[0])
        if "job201" not in self.ready:
            self.wait_ready("job201", 120)
        self.snapshot("bob")
        self.stop_client("job201")
        time.sleep(1)
        self.ask("get_server_list")
        return 0

    def save(self) -> None:
        self.results["ready"] = self.ready
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1))

    def cleanup(self) -> None:
        for name in list(self.procs):
            self.stop_client(name)
        try:
            self.ask("quit -t 5")
        except subprocess.TimeoutExpired:
            self.note("quit timed out")
        for _ in range(100):
            if not Path("/tmp/nvidia-mps/nvidia-cuda-mps-control.pid").exists():
                break
            time.sleep(0.1)
        for name in ("control.log", "server.log"):
            self.note(f"--- {name}\n" + tail(Path(LOG_DIR, name), 400))
        (self.out / "transcript.txt").write_text("\n".join(self.transcript) + "\n")
        self.save()


def tail(path: Path, lines: int) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError as e:
        return f"({e})\n"


def prepare() -> None:
    """Users, the client program and a config for mps-health, in the private /tmp."""
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/false",
                            user], check=True, timeout=30)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(mode=0o755)
    os.chmod(WORK, 0o777)  # torch writes caches under HOME
    (WORK / "client.py").write_text(CLIENT)
    os.makedirs(LOG_DIR, mode=0o755)
    os.chmod(LOG_DIR, 0o755)  # as the site's unit makes it (only the root daemon writes)
    squeue = WORK / "squeue"
    squeue.write_text("#!/bin/sh\n# squeue -h -w NODE -o '%A|%u|%U|%T|%M|%b' as Slurm prints it\n"
                      + "".join(f"echo '{job}|{user}|{pwd.getpwnam(user).pw_uid}|RUNNING|0:42|"
                                f"{gres}'\n" for _n, user, job, gres, _e, _i in CLIENTS))
    squeue.chmod(0o755)
    (WORK / "config.yaml").write_text(
        f"run_dir: {WORK}/run\nstate_dir: {WORK}/state\n"
        f"mps:\n  layout: node\n  log_dir: {LOG_DIR}\n"
        f"commands:\n  nvidia-cuda-mps-control: {CONTROL}\n  squeue: {squeue}\n"
        "control:\n  timeout_s: 5.0\n"
        "healthcheck:\n  boot_grace_s: 0\n"  # the GPU machine was booted minutes ago
        "checks:\n  disable: [strays]\n"  # other daemons of the machine are not ours
        + ("clients: {}\n" if have_clients_check() else ""))


def have_clients_check() -> bool:
    try:
        from mps_health.engine import registry
    except ImportError:
        return False
    return "clients" in registry.checks()


def main(argv: List[str]) -> int:
    out = Path(argv[-1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if "--inside" not in argv:
        # A private /tmp: the default pipe dir is ours alone, the machine's is untouched.
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "--",
                               sys.executable, os.path.abspath(__file__), "--inside",
                               *(["--fake"] if FAKE else []), str(out)],
                              timeout=560).returncode
    # Only the default pipe dir is made private: the rest of /tmp (maybe $OUT) stays.
    made = not os.path.exists("/tmp/nvidia-mps")
    os.makedirs("/tmp/nvidia-mps", exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0777", "mpsh-pipe", "/tmp/nvidia-mps"],
                   check=True)
    prepare()
    scenario = Scenario(out)
    try:
        return scenario.run()
    finally:
        scenario.cleanup()
        for user in USERS:
            subprocess.run(["userdel", user], timeout=30, check=False)
        subprocess.run(["umount", "/tmp/nvidia-mps"], timeout=30, check=False)
        if made:
            os.rmdir("/tmp/nvidia-mps")
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
