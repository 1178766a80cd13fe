"""Run inside a private PID namespace (tests/test_attack_lifetime.py): a user's daemon is
stopped, root's check hangs on its control client, the check is SIGKILLed; print the
control clients still alive afterwards, as JSON.

argv: WORK_DIR USER HOW [SETPRIV], HOW being "pid" (SIGKILL the check) or "group" (SIGKILL
its process group, as slurmd does at its time limit); SETPRIV, a stand-in for util-linux's
setpriv the check then starts its commands through (tests/fakes/late_setpriv.c). The
control binary is tests/fakes' fake, or the one LIFETIME_CONTROL names (the real one on a
GPU node: tests/gpu/test_lifetime_gpu.py). LIFETIME_KILL_DELAY_S: how long after the
client appears the check is killed (default at once); longer than the runner's own wait
for setpriv's exec, it lands after that wait gave up.
"""

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

FAKE = str(Path(__file__).resolve().parent.parent / "fakes" / "nvidia-cuda-mps-control")
CONTROL = os.environ.get("LIFETIME_CONTROL", FAKE)
KILL_DELAY_S = float(os.environ.get("LIFETIME_KILL_DELAY_S", "0"))


def live_clients(daemon: int) -> list:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (daemon, os.getpid()):
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if CONTROL.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def main() -> None:
    work, user, how = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    setpriv = sys.argv[4:]
    pw = pwd.getpwnam(user)
    pipe, log = work / "pipe", work / "log"
    config = work / "config.yaml"
    config.write_text(f"run_dir: {work}/run\nstate_dir: {work}/state\n"
                      f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n  daemon_user: {user}\n"
                      f"commands:\n  nvidia-cuda-mps-control: {CONTROL}\n"
                      # the kill, not the check's own timeout, ends the hung query
                      f"control:\n  timeout_s: 30\n")
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log)}
    start = ["/usr/bin/python3", FAKE, "-d"] if CONTROL == FAKE else [CONTROL, "-d"]
    subprocess.run(start, env=env, check=True, timeout=10,
                   user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.01)
    daemon = int(pid_file.read_text())
    subprocess.run(["kill", "-STOP", str(daemon)], check=True, timeout=10, user=pw.pw_uid,
                   group=pw.pw_gid, extra_groups=[])  # the user stops their own daemon
    started_as = [sys.executable, "-m", "mps_health.cli.main"]
    if setpriv:
        started_as = [sys.executable, "-c", "import runpy, sys\n"
                      "import mps_health.hostio.runner as runner\n"
                      "runner._SETPRIV = sys.argv.pop(1)\n"
                      "runpy.run_module('mps_health.cli.main', run_name='__main__')",
                      setpriv[0]]
    check = subprocess.Popen([*started_as, "check", "--config", str(config), "--only",
                              "control"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not live_clients(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)
    hung = live_clients(daemon)
    time.sleep(KILL_DELAY_S)
    if how == "group":
        os.killpg(check.pid, signal.SIGKILL)
    else:
        check.kill()
    check.wait()
    # The kernel signals the orphaned client at once, but on a loaded machine it may take a
    # moment to be gone; one that outlives the run stays for good and is still seen at 5 s.
    deadline = time.monotonic() + 5
    left = live_clients(daemon)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = live_clients(daemon)
    os.kill(daemon, signal.SIGKILL)
    print(json.dumps({"hung_clients": hung, "left": left}))


if __name__ == "__main__":
    main()
