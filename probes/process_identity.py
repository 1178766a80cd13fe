"""What an MPS process is: the one rule telling a control daemon, a client and a server
from a process that only takes their name (argv0 and ``comm`` are anyone's to set).

* The role comes from the command line: ``nvidia-cuda-mps-control`` with ``-d`` or ``-f``
  is a daemon (the real one keeps its ``-d``), without either a client (its name, comm
  and environment are otherwise a daemon's); ``nvidia-cuda-mps-server`` is a server.
* It must run the configured binary (``genuine``): ``/proc/PID/exe``'s real path
  (``readlink`` asks no filesystem, so a user's FUSE mount cannot stall us), then its
  device and inode. Servers run as their clients' users, so only their binary proves
  anything. A process running another binary is an impostor, never signalled. Where
  ``exe`` cannot be read (not root, ``--root``) ``genuine`` is None: the name decides and
  the checks soften verdicts that would need the binary.
* The server binary is the one beside the daemon's, unless ``commands.nvidia-cuda-mps-server``
  names one (the one in ``mps.binary_dirs`` counts too: Debian's is in /usr/sbin).
  Binaries are found by one rule (``locate``, ``binaries_for``): ``commands.NAME`` if a
  path, else NAME in ``mps.binary_dirs``, never the caller's PATH.

A genuine binary proves what a process *is*, not who started it: a user can hold the
world-executable binary at its exec under ptrace or in an LD_PRELOAD constructor
(``proves_nothing``); a server is MPS's only when tied to a daemon. A binary replaced on
disk no longer matches its running daemon (``PATH (deleted)``): restart MPS after updates.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence, Tuple

from mps_health.config.load import MPS_BINARY_DIRS

if TYPE_CHECKING:
    from mps_health.config.load import Config
    from mps_health.model.facts import ProcessFact

GONE_STATES = ("Z", "X")
# Stopped (SIGSTOP) and tracing stop: a process that may never have run its own code.
STOPPED_STATES = ("T", "t")
CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"


class Binary(NamedTuple):
    path: str  # the real path (links resolved), as /proc/PID/exe names it
    dev: int
    ino: int


class Binaries(NamedTuple):
    """The files a genuine control daemon (and client) and server run."""

    control: Tuple[Binary, ...]
    server: Tuple[Binary, ...]


def role_of(cmdline: Sequence[str]) -> str:
    """"control" (a daemon), "client", "server" or "unknown", by the command line."""
    if not cmdline:
        return "unknown"
    role = {CONTROL: "control", SERVER: "server"}.get(os.path.basename(cmdline[0]), "unknown")
    if role == "control" and not {"-d", "-f"} & set(cmdline[1:]):  # background, foreground
        return "client"
    return role


def _binary(path: str) -> Optional[Binary]:
    # Most binary dirs have none: no OSError to build. Only what exec could run (as
    # ``locate`` finds it): a file that cannot run is no process's binary.
    if not os.access(path, os.X_OK):
        return None
    try:
        st = os.stat(path)  # the file exec would run
        real = os.path.realpath(path)  # (an lstat per part of the path: only for those)
    except OSError:
        return None
    return Binary(real, st.st_dev, st.st_ino)


def _candidates(command: str, dirs: Sequence[str]) -> List[str]:
    """Every file ``command`` may name: itself if an absolute path, else its name in each
    of ``dirs`` (root's: ``mps.binary_dirs``), never in the caller's PATH."""
    if "/" in command:
        return [command] if os.path.isabs(command) else []
    return [os.path.join(d, command) for d in dict.fromkeys(dirs) if d.startswith("/")]


def binaries_of(control: str, server: Optional[str] = None,
                dirs: Sequence[str] = MPS_BINARY_DIRS) -> Binaries:
    """The configured binaries: ``control`` (a name: found in ``dirs``), and ``server`` if
    configured, else the ``nvidia-cuda-mps-server`` beside each control and in ``dirs``."""
    controls = [b for b in map(_binary, _candidates(control, dirs)) if b is not None]
    if server:
        servers = [_binary(p) for p in _candidates(server, dirs)]
    else:
        servers = [_binary(os.path.join(os.path.dirname(b.path), SERVER)) for b in controls]
        if controls:
            servers += [_binary(p) for p in _candidates(SERVER, dirs)]
    return Binaries(tuple(dict.fromkeys(controls)),
                    tuple(dict.fromkeys(b for b in servers if b is not None)))


def binaries_for(config: Config) -> Binaries:
    """The binaries the config names (``commands``), found in ``mps.binary_dirs``."""
    return binaries_of(config.command(CONTROL), config.commands.get(SERVER),
                       config.mps.binary_dirs)


def find(command: str, dirs: Sequence[str] = MPS_BINARY_DIRS) -> Optional[str]:
    """The first executable file ``command`` names (``_candidates``); None if none."""
    # Not shutil.which: a healthy run finds the control binary here, and shutil would
    # import bz2, lzma and zlib into every run.
    return next((p for p in _candidates(command, dirs)
                 if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def locate(config: Config, name: str = CONTROL) -> Optional[str]:
    """The file to run for MPS binary ``name`` (``find`` in the config's terms); None when
    there is none. The check, every remediation, ``unit`` and the Slurm hooks run what
    this finds, so a check never advises a reset that would find no binary."""
    return find(config.command(name), config.mps.binary_dirs)


def not_found(config: Config, name: str = CONTROL) -> str:
    """Why ``locate`` found nothing, in the runner's words, with where it looked."""
    command = config.command(name)
    where = "" if "/" in command else f" in {', '.join(config.mps.binary_dirs)}"
    return f"{command}: command not found{where}"


def runs_binary(proc_dir: str, pid: int, wanted: Sequence[Binary]) -> Optional[bool]:
    """Does process ``pid`` run one of ``wanted``? None when that cannot be told (exe not
    readable, or no configured binary found on this node)."""
    if not wanted:
        return None
    exe = f"{proc_dir}/{pid}/exe"
    try:
        link = os.readlink(exe)  # the kernel's name for the file: no filesystem asked
    except OSError:
        return None
    same_path = [b for b in wanted if b.path == link]
    if not same_path:
        return False  # another file, or the binary was replaced since (" (deleted)")
    try:
        st = os.stat(exe)
    except OSError:
        return None
    return any((st.st_dev, st.st_ino) == (b.dev, b.ino) for b in same_path)


def genuine(proc_dir: str, pid: int, role: str, binaries: Optional[Binaries]
            ) -> Optional[bool]:
    """Whether a process of ``role`` runs its configured binary (None: cannot tell)."""
    if binaries is None or role not in ("control", "client", "server"):
        return None
    return runs_binary(proc_dir, pid, binaries.server if role == "server"
                       else binaries.control)


def is_daemon(p: ProcessFact, role: str = "control") -> bool:
    """A live control daemon (started with -d/-f), or process of ``role``, not shown to
    run another binary."""
    return p.role == role and p.state not in GONE_STATES and p.genuine is not False


def is_server(p: ProcessFact) -> bool:
    return is_daemon(p, "server")


def proves_nothing(p: ProcessFact) -> bool:
    """A process held under ptrace or stopped: anyone may run the genuine binary (it is
    world-executable) and hold it at its exec, or pause it from an LD_PRELOAD
    constructor, so its ``exe`` says nothing of what MPS started. Never CRITICAL alone."""
    return p.traced or p.state in STOPPED_STATES


def is_impostor(p: ProcessFact) -> bool:
    """A live process that claims to be a daemon or server but runs another binary."""
    return p.role in ("control", "server") and p.state not in GONE_STATES and p.genuine is False


