"""Who writes in a root daemon's log dir, on the real binaries: the rule behind the log
dir's mode (0755, root's) in docs/security.md.

A root control daemon serves a CUDA client of an unprivileged user through a log dir
that only root may write. The client must work, the server MPS starts for it runs as
that user, and every file in the log dir must be root's: the daemon opens
``control.log`` and ``server.log`` itself, and the server writes only through the
descriptors it inherits from the daemon, so it needs no right in the dir. The user
cannot reopen those descriptors through /proc (the server changed its uid, so the
kernel makes it non-dumpable).

Run on the H200 as root: ``python3 -m pytest -m gpu tests/gpu/test_logdir_gpu.py -v -s``
(or ``bash tests/gpu/run.sh``).
"""

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
from mpsgpu import Mps, have_gpu, have_torch_cuda, say

pytestmark = pytest.mark.gpu

if not have_gpu() or os.geteuid() != 0:
    pytest.skip("needs root, an NVIDIA GPU and the real MPS binaries", allow_module_level=True)

USER = "mpsh-logdir"
CLIENT = (
    "import sys, torch\n"
    "x = torch.ones(1024, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('ready', float(x.sum()), flush=True)\n"
    "sys.stdin.read()\n"
)


def user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/false",
                        USER], check=True, timeout=30)
        return pwd.getpwnam(USER)


def servers_of(uid: int) -> List[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{name}/exe")
            st = os.stat(f"/proc/{name}")
        except OSError:
            continue
        if os.path.basename(exe) == "nvidia-cuda-mps-server" and st.st_uid == uid:
            found.append(int(name))
    return found


def open_in(pid: int, directory: Path) -> List[Tuple[str, str]]:
    """(fd, path) of what ``pid`` holds open inside ``directory``."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + "/"):
            held.append((fd, target))
    return sorted(held)


def reopen_as_user(pid: int, fd: str) -> str:
    """What the client's user gets when it opens the server's descriptor through /proc."""
    code = (f"import os\ntry:\n    os.close(os.open('/proc/{pid}/fd/{fd}', os.O_WRONLY | "
            "os.O_APPEND))\n    print('opened')\nexcept OSError as e:\n    print(e.strerror)\n")
    r = subprocess.run(["runuser", "-u", USER, "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=30, cwd="/")
    return (r.stdout + r.stderr).strip()


def test_a_job_users_server_writes_nothing_in_the_root_log_dir(mps: Mps) -> None:
    if not have_torch_cuda():
        pytest.skip("needs torch with CUDA for the client")
    pw = user()
    os.chown(mps.log, 0, 0)
    os.chmod(mps.log, 0o755)
    r = mps.start()
    assert mps.daemon_pid() is not None, r.stderr
    env = {k: v for k, v in mps.env.items() if k != "CUDA_MPS_LOG_DIRECTORY"}
    env["HOME"] = "/"
    client = subprocess.Popen(["runuser", "-u", USER, "--", sys.executable, "-c", CLIENT],
                              env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    server: Optional[int] = None
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line.startswith("ready"), client.stderr.read() if client.stderr else ""
        for _ in range(100):
            found = servers_of(pw.pw_uid)
            if found:
                server = found[0]
                break
            time.sleep(0.05)
        assert server is not None, "no MPS server runs as the client's user"
        held = open_in(server, mps.log)
        entries = sorted((e.name, e.stat(follow_symlinks=False).st_uid,
                          oct(e.stat(follow_symlinks=False).st_mode))
                         for e in os.scandir(mps.log))
        say(f"log dir {mps.log}: mode {oct(os.stat(mps.log).st_mode & 0o7777)}, root's",
            f"client of uid {pw.pw_uid}: {line.strip()}",
            f"server {server} runs as uid {os.stat(f'/proc/{server}').st_uid}; "
            f"files it holds open in the log dir: {held or 'none'}",
            f"log dir entries (name, uid, mode): {entries}")
        reopened = {path: reopen_as_user(server, fd) for fd, path in held}
        say(f"the user opening those through /proc/{server}/fd: {reopened}")
        assert {os.path.basename(p) for _, p in held} <= {"control.log", "server.log"}
        assert all(answer != "opened" for answer in reopened.values()), reopened
        assert {name for name, _, _ in entries} >= {"control.log", "server.log"}
        assert all(uid == 0 for _, uid, _ in entries), entries
        text = (mps.log / "server.log").read_text(errors="replace")
        assert str(server) in text or "Server" in text, text[-2000:]
    finally:
        if client.stdin is not None:
            client.stdin.close()
        try:
            client.wait(timeout=60)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait(timeout=10)
