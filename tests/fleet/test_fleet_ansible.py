"""contrib/ansible run for real by ansible-playbook against this machine (connection
local): the role builds mps-health's wheel from an unpacked sdist into a wheel folder that
holds its dependencies' wheels, installs from that folder only (--no-index) into a
virtualenv with links to the commands, and configures a node whose MPS is broken (fake
daemon killed: stale pipe dir, mode 0700); the audit reports it, the reset repairs it, a
second reset changes nothing; within remediation.cooldown_s of that repair the role
resets nothing, even with -e force=true; a reset refuses while a client is connected and
-e force=true overrides it."""
# ruff: noqa: F811  (the fixtures dists and wheelhouse come from fleethelp)

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

from clirun import mps_health
from conftest import FAKE_CONTROL
from fleethelp import CONTRIB, dists, need, wheelhouse  # noqa: F401
from mpsdaemon import start_daemon
from remhelp import make_dirs

ANSIBLE = CONTRIB / "ansible"


def recap(out: str) -> dict:
    m = re.search(r"^localhost\s+:\s+(.*)$", out, re.M)
    assert m, out[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def playbook(base: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    exe = need("ansible-playbook")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(base / "ans-tmp"),
               ANSIBLE_REMOTE_TEMP=str(base / "ans-tmp"), ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_ROLES_PATH=str(ANSIBLE / "roles"), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_HOME=str(base / "ans-home"),
               # No pip config of this machine, and an index that answers nothing: the
               # role must install from its wheel folder alone.
               PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_EXTRA_INDEX_URL="",
               PIP_INDEX_URL="http://127.0.0.1:9/simple")
    r = subprocess.run([exe, "-i", str(base / "inventory.ini"), str(ANSIBLE / name), *extra],
                       capture_output=True, text=True, timeout=180, env=env)
    print(f"--- ansible-playbook {name} {' '.join(extra)} (rc {r.returncode})\n{r.stdout}")
    return r


def node_state(base: Path) -> dict:
    r = mps_health("check", "--config", str(base / "etc" / "config.yaml"), "--format", "json")
    return json.loads(r.stdout)


def wheel_folder(base: Path, wheelhouse: Path) -> Path:
    """The dependencies' wheels for this Python (mps-health's own is built by the role):
    repacked from this interpreter's install, so no index is needed."""
    wheels = base / "wheels"
    shutil.copytree(wheelhouse, wheels)
    return wheels


def age_resets(state_dir: Path) -> None:
    """Move every recorded reset two hours back: past the cooldown."""
    from mps_health.hostio import planned
    from mps_health.hostio.state import StateFile

    records, error = planned.load(str(state_dir))
    assert not error and records
    aged = tuple(r._replace(at=r.at - 7200.0) for r in records)
    assert StateFile(str(state_dir), planned.NAME).save(aged) == ""


def test_role_audit_reset(site, dists, wheelhouse: Path) -> None:
    base = site.root
    wheels = wheel_folder(base, wheelhouse)
    source = base / "source"
    with tarfile.open(dists.sdist) as tar:
        tar.extractall(source)  # our own sdist, built in this session
    [source] = list(source.iterdir())
    pipe, log = base / "pipe", base / "log"
    make_dirs(pipe, log)
    os.kill(start_daemon(pipe, log), signal.SIGKILL)  # stale: every entry left behind
    pipe.chmod(0o700)
    (base / "root" / "etc").mkdir(parents=True)
    venv = base / "venv"
    settings = {
        "run_dir": f"{base}/run", "state_dir": f"{base}/state",
        "commands": {"nvidia-cuda-mps-control": FAKE_CONTROL},
        "control": {"timeout_s": 1.0},
        # Other helpers' daemons on a shared machine are not this node's to judge.
        "checks": {"only": ["daemon", "control", "directories"]},
        "mps": {"layout": "node", "pipe_dir": str(pipe), "log_dir": str(log)},
        "remediation": {"audit_log": f"{base}/audit.log", "syslog": False,
                        "quit_timeout_s": 2, "term_timeout_s": 2, "verify_timeout_s": 10,
                        "cooldown_s": 3600},
    }
    group_vars = {
        "mps_health_wheels": str(wheels),
        "mps_health_build_wheel": True,
        "mps_health_source": str(source),
        "mps_health_wheels_on_node": str(base / "node-wheels"),
        "mps_health_venv": str(venv),
        "mps_health_python": sys.executable,
        "mps_health_sbin": str(base / "sbin"),
        "mps_health_plugin_dir": str(base / "plugins"),
        "mps_health_bin": f"{base}/sbin/mps-health",  # the playbooks read it too
        "mps_health_config_path": f"{base}/etc/config.yaml",
        "mps_health_config": settings,
        "mps_health_root": f"{base}/root",
        "mps_health_exporter": True,
        "mps_health_textfile": True,
        "mps_health_textfile_dir": f"{base}/textfile",
        "mps_health_systemd_unit_dir": str(base),
        "mps_health_manage_services": False,
    }
    (base / "inventory.ini").write_text(
        "[gpu_nodes]\nlocalhost ansible_connection=local\n")
    (base / "group_vars").mkdir()
    # JSON is YAML: the inventory's group_vars beside it.
    (base / "group_vars" / "gpu_nodes.yml").write_text(json.dumps(group_vars))

    # The role: installs the wheel, writes the config, the tmpfiles guard and the unit.
    r = playbook(base, "site.yml")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert recap(r.stdout)["failed"] == 0
    assert (venv / "bin" / "mps-health").exists()
    assert (base / "sbin/mps-health").resolve() == (venv / "bin/mps-health").resolve()
    assert os.readlink(base / "plugins/check_mps") == f"{venv}/bin/check_mps"
    assert (venv.stat().st_mode & 0o777) == 0o755
    assert any((base / "node-wheels").glob("mps_health-0.1.0-*.whl"))  # built by the role
    guard = (base / "root/etc/tmpfiles.d/mps-health.conf").read_text()
    assert f"x {pipe}\n" in guard and f"x {log}\n" in guard
    unit = (base / "mps-health-exporter.service").read_text()
    assert f"ExecStart={base}/sbin/mps-health exporter $MPS_HEALTH_EXPORTER_ARGS" in unit
    assert f"--config {base}/etc/config.yaml" in unit
    # The textfile units: the service runs the role's mps-health on its config into the
    # given directory, as the timer starts it; run its command line as systemd would.
    assert (base / "mps-health-textfile.timer").read_text().startswith("[Unit]")
    textfile_unit = (base / "mps-health-textfile.service").read_text()
    assert f"Environment=MPS_HEALTH_TEXTFILE_DIR={base}/textfile\n" in textfile_unit
    [exec_start] = [line.split("=", 1)[1] for line in textfile_unit.splitlines()
                    if line.startswith("ExecStart=")]
    assert exec_start == (f"{base}/sbin/mps-health exporter --textfile "
                          f"${{MPS_HEALTH_TEXTFILE_DIR}} --config {base}/etc/config.yaml")
    (base / "textfile").mkdir()
    ran = subprocess.run(exec_start.replace("${MPS_HEALTH_TEXTFILE_DIR}",
                                            f"{base}/textfile").split(),
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "mps_health_build_info" in (base / "textfile/mps_health.prom").read_text()
    again = playbook(base, "site.yml")
    assert again.returncode == 0 and recap(again.stdout)["changed"] == 0, again.stdout[-3000:]

    # The audit reports the broken node and its codes, and changes nothing.
    r = playbook(base, "audit.yml")
    assert r.returncode == 0, r.stdout[-4000:]
    assert recap(r.stdout)["changed"] == 0
    assert "MPS audit: 1 of 1 nodes unhealthy" in r.stdout
    row = re.search(r"localhost\s+CRITICAL\s+(.*?)\"", r.stdout)
    assert row, r.stdout[-3000:]
    # One cause, one alert: the dead daemon's control-absent is folded under it.
    assert "control-absent" not in row.group(1)
    for code in ("daemon-stale node", "pipe-dir-mode node"):
        assert code in row.group(1)

    # The reset repairs it (changed), then a second run changes nothing.
    r = playbook(base, "reset.yml")
    assert r.returncode == 0, r.stdout[-4000:]
    assert recap(r.stdout)["changed"] == 1
    assert re.search(r"localhost\s+repaired", r.stdout)
    assert node_state(base)["problems"] == []
    assert (pipe.stat().st_mode & 0o7777) == 0o777
    r = playbook(base, "reset.yml")
    assert r.returncode == 0 and recap(r.stdout)["changed"] == 0, r.stdout[-3000:]
    assert re.search(r"localhost\s+healthy, nothing done", r.stdout)
    r = playbook(base, "audit.yml")
    assert "MPS audit: all 1 nodes healthy" in r.stdout

    # A connected client makes the reset refuse (skipped, nothing changed) unless forced.
    client = subprocess.Popen(["sleep", "120"])
    try:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        said = subprocess.run([FAKE_CONTROL], input=f"fake_client_connect "
                              f"{client.pid}\n", env=env, capture_output=True, text=True,
                              timeout=10)
        assert said.stdout.strip().isdigit(), said
        # Broken while a job uses it, in a way only a restart repairs (a dir mode alone
        # is fixed in place, no restart: the reset would not be refused).
        (pipe / "log").unlink()
        (pipe / "log").write_text("")
        daemon_before = (pipe / "nvidia-cuda-mps-control.pid").read_text()
        # Reset an hour ago at most (remediation.cooldown_s): the role (--automatic)
        # leaves it alone, even with -e force=true.
        r = playbook(base, "reset.yml", "-e", "force=true")
        assert r.returncode == 0 and recap(r.stdout)["changed"] == 0, r.stdout[-3000:]
        assert re.search(r"localhost\s+skipped: reset lately \(cooldown\) on node", r.stdout)
        assert (pipe / "nvidia-cuda-mps-control.pid").read_text() == daemon_before
        assert "event=refused result=cooldown" in (base / "audit.log").read_text()
        age_resets(base / "state")
        r = playbook(base, "reset.yml")
        assert r.returncode == 0 and recap(r.stdout)["changed"] == 0, r.stdout[-3000:]
        assert re.search(r"localhost\s+skipped: clients connected on node", r.stdout)
        assert (pipe / "nvidia-cuda-mps-control.pid").read_text() == daemon_before
        r = playbook(base, "reset.yml", "-e", "force=true")
        assert r.returncode == 0 and recap(r.stdout)["changed"] == 1, r.stdout[-3000:]
        assert re.search(r"localhost\s+forced reset of node", r.stdout)
        assert node_state(base)["problems"] == []
        assert (pipe / "nvidia-cuda-mps-control.pid").read_text() != daemon_before
    finally:
        client.kill()
        client.wait()
