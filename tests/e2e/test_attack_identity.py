"""A user's processes named like MPS's daemon and server, run as an unprivileged uid.

argv0 and ``comm`` are anyone's to set (a copy of any program named
``nvidia-cuda-mps-server`` has both), and MPS servers run as their clients' users, so
neither name nor owner can tell a real server from a pretender: the binary it runs can
(/proc/PID/exe, ``mps_health.probes.process_identity``). A pretender is at most the WARNING
``mps-impostor`` naming its owner: never CRITICAL (a drain), never ended by a reset.
"""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from clirun import mps_health
from hostile import ATTACKER, as_user, ensure_user, exec_done
from nodesite import Daemon, Site
from remhelp import audit_in


@pytest.fixture
def node(site: Site) -> Tuple[Path, Path, Daemon]:
    """A node-layout instance on a 0777 pipe dir, served by a root daemon (the fake
    binaries, found on PATH as a site finds the real ones); a reset's audit trail in the
    site."""
    daemon = site.start_daemon()
    return Path(site.config(audit_in(site))), daemon.pipe_dir, daemon


@pytest.fixture
def posers() -> Iterator[List[subprocess.Popen]]:
    started: List[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def pose(started: List[subprocess.Popen], base: Path, name: str, program: str,
         args: List[str], pipe: Path) -> int:
    """The attacker's copy of ``program`` named ``name`` (argv0 and comm as MPS's), run
    as the attacker with the instance's pipe dir in its environment."""
    own = base / "evil"
    own.mkdir(exist_ok=True)
    own.chmod(0o755)
    shutil.copy(program, own / name)
    p = subprocess.Popen([str(own / name), *args], env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                         stdin=subprocess.DEVNULL, **as_user(ATTACKER))
    started.append(p)
    exec_done(p.pid)  # its command line and environment in /proc
    return p.pid


def check_json(config: Path, only: str = "daemon,strays") -> Tuple[int, dict]:
    r = mps_health("check", "--config", str(config), "--only", only, "--format", "json")
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


# strays judges every process on the machine: in its own PID namespace, the test sees
# only the impostors it started, not other test runs' (tests/helpers/privatepids.py).
@pytest.mark.private_pids
def test_a_users_fake_server_and_daemon_are_a_warning_naming_them(node, site: Site,
                                                                  posers) -> None:
    config, pipe, daemon = node
    uid = ensure_user(ATTACKER).pw_uid
    server = pose(posers, site.root, "nvidia-cuda-mps-server", "/usr/bin/sleep", ["120"], pipe)
    fake_daemon = pose(posers, site.root, "nvidia-cuda-mps-control", "/usr/bin/tail",
                       ["-f", "/dev/null"], pipe)
    rc, report = check_json(config)
    found = {(p["instance"], p["code"]): p for p in report["problems"]}
    assert rc == 1, report  # a WARNING, not a CRITICAL
    assert all(p["state"] != "CRITICAL" for p in report["problems"]), report
    impostor = found[("", "mps-impostor")]
    assert impostor["state"] == "WARNING" and f"uid {uid}" in impostor["message"]
    assert str(server) in impostor["message"] and str(fake_daemon) in impostor["message"]
    assert ("", "server-orphaned") not in found and ("node", "daemon-duplicate") not in found
    assert ("node", "daemon-foreign") not in found
    # The root daemon is still the one daemon of the instance.
    [run] = [c for c in report["checks"] if c["name"] == "daemon"]
    assert [(r["state"], r["code"]) for r in run["results"]] == [("OK", "ok")]
    assert f"control daemon {daemon.pid} serves" in run["results"][0]["message"]


def test_a_reset_never_ends_a_users_fake_server(node, site: Site, posers) -> None:
    config, pipe, _ = node
    server = pose(posers, site.root, "nvidia-cuda-mps-server", "/usr/bin/sleep", ["120"], pipe)
    r = mps_health("remediate", "reset", "node", "--config", str(config), "--force")
    assert str(server) not in r.stdout, r.stdout
    assert posers[0].poll() is None  # still running: never signalled
