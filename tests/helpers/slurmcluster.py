"""A real one-node Slurm cluster for tests: munge, slurmctld and slurmd in a private dir.

Everything the daemons touch lives under one temp dir: the munge key and socket
(``AuthInfo=socket=...``), the state and spool dirs, pid files, logs, slurm.conf and
gres.conf. The controller and slurmd listen on free ports picked at random, so several
clusters (other test sessions on the same machine) never meet. Clients find it through
``SLURM_CONF`` (see :attr:`SlurmCluster.env`).

The node has ``Gres=gpu:2,mps:200`` (``GresTypes=gpu,mps``, ``select/cons_tres``);
gres.conf points at ``dev/nvidia0`` and ``dev/nvidia1`` in the private dir. Those are
character device nodes made with mknod (major 195, the NVIDIA major): Slurm 22.05
rejects a plain file ("is not a valid character or block device") and then sets no
CUDA_VISIBLE_DEVICES for jobs. Nothing opens them, so no driver is needed; where mknod
is not allowed they fall back to plain files and jobs see no CUDA_VISIBLE_DEVICES.

Every process is started by us (munged -F, slurmctld -D, slurmd -D) and stopped by its
PID. Job steps' slurmstepd processes are reparented to init, so at stop they are found
by PID in /proc, verified by the SLURM_CONF of this cluster in their environment.

Needs root (slurmd, munge key ownership) and Debian's ``slurm-wlm`` and ``munge``; or,
with ``root=`` a started :class:`slurmroot.SlurmRoot`, the same daemons and clients come
from that Debian 13 root (Slurm 24.11) instead. Paths under /tmp are the same on both
sides and the processes are this machine's, so everything below holds for both.
"""

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from slurmroot import SlurmRoot

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("scontrol", "srun", "squeue", "scancel", "sinfo")
NVIDIA_MAJOR = 195
TEST_USER = "mpshtest"


class SlurmClusterError(RuntimeError):
    """The cluster could not be started (the message carries the daemons' log tails)."""


def missing_programs() -> List[str]:
    """The Slurm/munge programs this machine lacks (empty when the fixture can run)."""
    return [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p) is None]


def skip_reason() -> Optional[str]:
    """Why a real Slurm cannot be started here, or None when it can."""
    missing = missing_programs()
    if missing:
        return (f"real Slurm needs {', '.join(missing)}: apt-get install slurm-wlm munge "
                "(.ci/apt-packages lists them)")
    if os.geteuid() != 0:
        return "real Slurm needs root (slurmd and munged run as root here)"
    return None


def free_port(taken: Iterable[int] = ()) -> int:
    """A TCP port nobody listens on, picked at random (never a fixed port)."""
    for _ in range(200):
        port = random.randint(20000, 59999)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SlurmClusterError("no free TCP port found in 200 tries")


def ensure_user(name: str = TEST_USER) -> pwd.struct_passwd:
    """An ordinary local user for jobs (created once; reused if it exists)."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    r = subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh",
                        name], capture_output=True, text=True, timeout=30)
    if r.returncode not in (0, 9):  # 9: created meanwhile by another test session
        raise SlurmClusterError(f"useradd {name} failed: {r.stderr.strip()}")
    return pwd.getpwnam(name)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path.name}: (none)"
    return f"--- {path.name} (last {lines} lines):\n" + "\n".join(text[-lines:])


class SlurmCluster:
    """One node (``node_name``) with ``gpus`` GPUs and ``mps_per_gpu`` mps each.

    ``health_check_program``/``health_check_interval``, ``prolog``, ``epilog`` and
    ``task_prolog`` go into slurm.conf as given; ``extra_conf`` lines are appended
    (e.g. ``PrologFlags=Alloc``). ``gres_conf`` replaces the generated gres.conf text.
    """

    def __init__(self, node_name: str = "mpsnode", gpus: int = 2, mps_per_gpu: int = 100,
                 cpus: int = 8, health_check_program: Optional[str] = None,
                 health_check_interval: Optional[int] = None,
                 health_check_node_state: str = "ANY", prolog: Optional[str] = None,
                 epilog: Optional[str] = None, task_prolog: Optional[str] = None,
                 extra_conf: Sequence[str] = (), gres_conf: Optional[str] = None,
                 base_dir: Optional[Union[str, Path]] = None,
                 return_to_service: int = 2, root: Optional["SlurmRoot"] = None,
                 peers: Sequence[str] = ()) -> None:
        self.node_name = node_name
        # Other nodes of the partition, declared only: no slurmd answers for them
        # (127.0.0.2), so they stay DOWN, and can be drained by 'scontrol update'.
        self.peers = list(peers)
        self.gpus = gpus
        self.mps_per_gpu = mps_per_gpu
        self.cpus = cpus
        self.health_check_program = health_check_program
        self.health_check_interval = health_check_interval
        self.health_check_node_state = health_check_node_state
        self.prolog, self.epilog, self.task_prolog = prolog, epilog, task_prolog
        self.extra_conf = list(extra_conf)
        self.return_to_service = return_to_service
        self.root = root
        self.gres_conf_text = gres_conf
        self._own_dir = base_dir is None
        self.dir = Path(base_dir) if base_dir else \
            Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # /tmp: seen by the root too
        self.host = os.uname().nodename.split(".")[0]
        self.ctld_port = 0
        self.slurmd_port = 0
        self.procs: Dict[str, subprocess.Popen] = {}
        self.devices: List[Path] = []

    # --- paths and environment ----------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.dir / "gres.conf"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.sock"

    @property
    def env(self) -> Dict[str, str]:
        """Our environment plus SLURM_CONF: what every Slurm client needs (and, for a
        cluster in a root, the root's clients first on PATH)."""
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        if self.root is not None:
            env["PATH"] = f"{self.root.client_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    @property
    def version(self) -> str:
        """``scontrol --version`` of the Slurm this cluster runs, e.g. ``slurm 24.11.5``."""
        return self.run(["scontrol", "--version"], timeout=30).stdout.strip()

    def command(self, argv: Sequence[str], user: Optional[str] = None,
                env: Optional[Mapping[str, str]] = None,
                ) -> Tuple[List[str], Dict[str, object]]:
        """(argv, Popen keywords) running ``argv`` where this cluster's Slurm lives."""
        if self.root is None:
            return list(argv), {"env": {**self.env, **(env or {})}, **self._as_user(user)}
        clean = {"SLURM_CONF": str(self.conf), "LANG": "C.UTF-8", "HOME": "/root",
                 **(env or {})}
        return self.root.wrap(argv, user), {"env": clean, "cwd": str(self.dir)}

    def client_commands(self) -> Dict[str, str]:
        """mps-health's ``commands:`` for this cluster's scontrol and squeue (absolute:
        its runner looks a bare name up on our own PATH, not on the Context's)."""
        if self.root is None:
            return {}
        return {name: str(self.root.client_dir / name) for name in ("scontrol", "squeue")}

    def mps_health_argv(self) -> List[str]:
        """mps-health as the node has it: the root's install, or this checkout's."""
        from slurmroot import mps_health_argv

        return mps_health_argv(self.root)

    # --- start and stop -------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        """Start munge, slurmctld and slurmd; return when the node is IDLE."""
        reason = skip_reason() if self.root is None else None
        if reason:
            raise SlurmClusterError(reason)
        try:
            self._layout()
            self._start_munge()
            for attempt in range(3):  # a random port may be taken between pick and bind
                self.ctld_port = free_port()
                self.slurmd_port = free_port({self.ctld_port})
                self.write_conf()
                if self._start_controller(timeout / 3):
                    break
                if attempt == 2:
                    raise SlurmClusterError("slurmctld did not come up\n" + self.logs())
            self._start_slurmd()
            self.wait_state(lambda s: s == "IDLE", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _layout(self) -> None:
        self.dir.chmod(0o755)  # ordinary users read slurm.conf and reach the munge socket
        for sub in ("munge", "state", "spool", "log", "dev"):
            (self.dir / sub).mkdir(mode=0o755, exist_ok=True)
        key = self.dir / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.devices = [self.dir / "dev" / f"nvidia{i}" for i in range(self.gpus)]
        for i, dev in enumerate(self.devices):
            if dev.exists():
                continue
            try:
                os.mknod(dev, 0o644 | 0o020000, os.makedev(NVIDIA_MAJOR, i))  # S_IFCHR
            except OSError:
                dev.touch()  # no CAP_MKNOD: a plain file (jobs then get no CUDA_VISIBLE_DEVICES)

    def write_conf(self) -> None:
        """(Re)write slurm.conf and gres.conf from the current settings."""
        d = self.dir
        lines = [
            "ClusterName=mpshealth",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu,mps",
            f"ReturnToService={self.return_to_service}",
            "SlurmdParameters=config_overrides",
            "KillWait=2",
            "MinJobAge=2",
            "InactiveLimit=0",
        ]
        if self.health_check_program:
            lines += [f"HealthCheckProgram={self.health_check_program}",
                      f"HealthCheckInterval={self.health_check_interval or 60}",
                      f"HealthCheckNodeState={self.health_check_node_state}"]
        if self.prolog:
            lines.append(f"Prolog={self.prolog}")
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        if self.task_prolog:
            lines.append(f"TaskProlog={self.task_prolog}")
        lines += self.extra_conf
        gres = f"gpu:{self.gpus},mps:{self.gpus * self.mps_per_gpu}" if self.gpus else ""
        lines += [
            f"NodeName={self.node_name} NodeAddr=127.0.0.1 NodeHostname={self.host} "
            f"CPUs={self.cpus} RealMemory=1000" + (f" Gres={gres}" if gres else "")
            + " State=UNKNOWN",
            *(f"NodeName={p} NodeAddr=127.0.0.2 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
              for p in self.peers),
            f"PartitionName=debug Nodes={','.join([self.node_name, *self.peers])} Default=YES "
            "MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.conf.chmod(0o644)
        if self.gres_conf_text is not None:
            text = self.gres_conf_text
        else:
            text = "".join(f"Name=gpu File={dev}\n" for dev in self.devices)
            text += "".join(f"Name=mps Count={self.mps_per_gpu} File={dev}\n"
                            for dev in self.devices)
        self.gres_conf.write_text(text)
        self.gres_conf.chmod(0o644)

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps it
        full, kwargs = self.command(argv)
        try:
            proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    **kwargs)  # type: ignore[call-overload]
        finally:
            out.close()
        self.procs[name] = proc
        return proc

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        self._spawn("munged", ["munged", "--foreground", f"--socket={self.munge_socket}",
                               f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                               f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"])
        self._wait(lambda: self.munge_socket.exists(), 15, "munged did not create its socket",
                   "munged")

    def _start_controller(self, timeout: float) -> bool:
        """Start slurmctld; False if it died at once (e.g. its port was taken meanwhile)."""
        proc = self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.procs.pop("slurmctld", None)
                return False
            r = self.run(["scontrol", "ping"], timeout=10)
            if "is UP" in r.stdout:
                return True
            time.sleep(0.2)
        return False

    def start_controller(self, timeout: float = 30.0) -> None:
        """Start slurmctld again (after :meth:`stop_controller`), on the same port."""
        if not self._start_controller(timeout):
            raise SlurmClusterError("slurmctld did not come back\n" + self.logs())

    def _start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node_name, "-f", str(self.conf)])

    def stop_controller(self) -> None:
        """Stop slurmctld by its PID (to test what clients see when it is down)."""
        self._terminate("slurmctld")

    def _terminate(self, name: str, grace: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)

    def stop(self) -> None:
        """Cancel jobs, stop the daemons by PID, kill our leftover job steps, remove the dir."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.cancel_all(timeout=15)
        for name in ("slurmd", "slurmctld"):
            self._terminate(name)
        self._kill_leftovers()
        self._terminate("munged")
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """slurmstepd and job processes that still carry this cluster's SLURM_CONF."""
        marker = f"SLURM_CONF={self.conf}".encode()
        spared = {os.getpid(), *(p.pid for p in self.procs.values())}  # munged stops last
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in spared:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if marker in environ:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients --------------------------------------------------------------------
    def run(self, argv: Sequence[str], user: Optional[str] = None, timeout: float = 60,
            env: Optional[Mapping[str, str]] = None, check: bool = False,
            ) -> subprocess.CompletedProcess:
        """Run a client command (as ``user`` if given) with this cluster's SLURM_CONF."""
        full, kwargs = self.command(argv, user, env)
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout,
                              check=check, **kwargs)  # type: ignore[call-overload]

    def start_job(self, argv: Sequence[str], user: Optional[str] = None,
                  env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
        """Start ``srun ...`` (or any client) in the background; the caller waits on it."""
        full, kwargs = self.command(argv, user, env)
        return subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                **kwargs)  # type: ignore[call-overload]

    def _as_user(self, user: Optional[str]) -> Dict[str, object]:
        if user is None:
            return {"cwd": str(self.dir)}
        pw = pwd.getpwnam(user)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [],
                "cwd": str(self.dir)}

    def scontrol(self, *args: str, timeout: float = 30) -> str:
        r = self.run(["scontrol", *args], timeout=timeout)
        if r.returncode != 0:
            raise SlurmClusterError(f"scontrol {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def node_line(self) -> str:
        """``scontrol -d show node NODE -o``: one line of Key=Value pairs."""
        return self.scontrol("-d", "show", "node", self.node_name, "-o").strip()

    def node_state(self) -> str:
        for field in self.node_line().split():
            if field.startswith("State="):
                return field[len("State="):]
        return ""

    def wait_state(self, accept, timeout: float = 30.0) -> str:
        """Wait until ``accept(State)`` is true; raise with the daemons' logs if not."""
        state = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmClusterError(f"{name} exited with status {proc.returncode}\n"
                                            + self.logs())
            with contextlib.suppress(SlurmClusterError, subprocess.TimeoutExpired):
                state = self.node_state()
                if accept(state):
                    return state
            time.sleep(0.2)
        raise SlurmClusterError(f"node {self.node_name} is {state or 'unknown'} after "
                                f"{timeout:g}s\n" + self.logs())

    def job_ids(self) -> List[str]:
        r = self.run(["squeue", "-h", "-o", "%A"], timeout=30)
        return r.stdout.split()

    def wait_running(self, count: int, timeout: float = 30.0) -> List[str]:
        """Wait until ``count`` jobs run; their ids."""
        deadline = time.monotonic() + timeout
        running: List[str] = []
        while time.monotonic() < deadline:
            r = self.run(["squeue", "-h", "-t", "RUNNING", "-o", "%A"], timeout=30)
            running = r.stdout.split()
            if len(running) >= count:
                return running
            time.sleep(0.2)
        raise SlurmClusterError(f"{len(running)} of {count} jobs running after {timeout:g}s\n"
                                + self.logs())

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until the queue is empty and the node idle again."""
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids], timeout=30)
        deadline = time.monotonic() + timeout
        while self.job_ids() and time.monotonic() < deadline:
            time.sleep(0.2)

    def logs(self, lines: int = 15) -> str:
        """Tails of every daemon's log, for error messages."""
        paths = [self.log_dir / "slurmctld.log", self.log_dir / "slurmd.log",
                 self.log_dir / "slurmctld.out", self.log_dir / "slurmd.out",
                 self.log_dir / "munged.out"]
        return "\n".join(tail(p, lines) for p in paths)

    def _wait(self, ready, timeout: float, what: str, name: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        raise SlurmClusterError(what + "\n" + self.logs())
