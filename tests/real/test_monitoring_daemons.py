"""check_mps run by a live Nagios 4 and a live Icinga 2 daemon, with the definitions in
contrib/, OK on a healthy instance and CRITICAL on a broken one.

Each daemon runs from a private temp dir as its own unprivileged user (nagios), as on a
monitoring server, and is asked for a forced check through its external command pipe;
the state and output are read back from what the daemon itself wrote (Nagios'
status.dat, Icinga's perfdata file). The plugin runs with the system Python (every user
can run it) on a private link to this checkout (the package), against a fake
daemon started as root.
"""

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import pytest
from conftest import FAKE_CONTROL, REPO
from monitoring_tools import need, stop
from nodesite import Site
from remhelp import kill_and_wait

SYSTEM_PYTHON = "/usr/bin/python3"  # one every user can run (this venv's is under /root)


@pytest.fixture
def monitored(site: Site) -> Dict[str, Path]:
    """A site with the plugin, its config, an instance's dirs and a fake daemon."""
    try:
        user = pwd.getpwnam("nagios")
    except KeyError:
        pytest.skip("no nagios user (the nagios4 package makes it)")
    if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root and /usr/bin/python3")
    base = site.root
    (base / "lib").mkdir()
    (base / "lib" / "mps_health").symlink_to(REPO)  # the checkout root is the package
    # check_mps is a nagiosplugin check: the system Python may lack it, and nagios cannot
    # read this venv's (under /root), so a copy goes beside the package.
    import nagiosplugin

    shutil.copytree(Path(nagiosplugin.__file__).parent, base / "lib" / "nagiosplugin")
    daemon = site.start_daemon()
    cfg = site.config(commands={"nvidia-cuda-mps-control": FAKE_CONTROL})
    plugin = base / "check_mps"
    plugin.write_text(f"#!/bin/sh\nPYTHONPATH={base}/lib exec {SYSTEM_PYTHON} -m "
                      f"mps_health.cli.check_mps --config {cfg} "
                      "--only daemon,control,directories \"$@\"\n")
    plugin.chmod(0o755)
    work = base / "daemon"
    work.mkdir()
    os.chown(work, user.pw_uid, user.pw_gid)
    return {"base": base, "plugin": plugin, "work": work, "daemon": Path(str(daemon.pid))}


def poll(what: str, probe: Callable[[], Optional[str]], timeout: float,
         log: Path) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.3)
    raise AssertionError(f"no {what} within {timeout:g}s; "
                         f"{log.read_text()[-3000:] if log.exists() else 'no log'}")


def command(pipe: Path, line: str) -> None:
    poll("command pipe", lambda: "ok" if pipe.exists() else None, 30, pipe)
    with open(pipe, "w") as f:
        f.write(f"[{int(time.time())}] {line}\n")


# --- Nagios 4 --------------------------------------------------------------------------

def nagios_main(monitored: Dict[str, Path]) -> Path:
    base, work = monitored["base"], monitored["work"]
    (base / "hosts.cfg").write_text(f"""
define host {{
    use          mps-gpu-node,linux-server
    host_name    gpu01
    address      127.0.0.1
    _MPS_PLUGIN  {monitored["plugin"]}
}}
define service {{
    use                  mps-health-service
    host_name            gpu01
    service_description  MPS local
    check_command        check_mps_local!0.5!1
}}
""")
    files = {k: work / v for k, v in (
        ("log_file", "nagios.log"), ("object_cache_file", "objects.cache"),
        ("precached_object_file", "objects.precache"), ("status_file", "status.dat"),
        ("lock_file", "nagios.pid"), ("temp_file", "nagios.tmp"), ("temp_path", "."),
        ("check_result_path", "."), ("state_retention_file", "retention.dat"),
        ("command_file", "nagios.cmd"))}
    main = base / "nagios.cfg"
    main.write_text("\n".join([
        *(f"cfg_file=/etc/nagios4/objects/{n}.cfg"
          for n in ("commands", "contacts", "timeperiods", "templates")),
        "cfg_dir=/etc/nagios-plugins/config",
        f"cfg_file={REPO / 'contrib' / 'nagios' / 'mps-health.cfg'}",
        f"cfg_file={base / 'hosts.cfg'}", "resource_file=/etc/nagios4/resource.cfg",
        "nagios_user=nagios", "nagios_group=nagios", "check_external_commands=1",
        "command_check_interval=1s", "status_update_interval=1", "execute_host_checks=0",
        "enable_notifications=0", "illegal_macro_output_chars=`~$&|'\"<>",
        *(f"{k}={v}" for k, v in files.items()), ""]))
    for f in (main, base / "hosts.cfg"):
        f.chmod(0o644)
    return main


def nagios_result(status: Path, checked_after: float) -> Optional[str]:
    """'state|output' of the service once Nagios checked it after ``checked_after``."""
    text = status.read_text() if status.exists() else ""
    at = text.find("service_description=MPS local")
    if at < 0:
        return None
    block = dict(line.strip().split("=", 1) for line in text[at:text.find("}", at)].splitlines()
                 if "=" in line)
    if block.get("has_been_checked") != "1" or int(block.get("last_check", 0)) < checked_after:
        return None
    return f"{block['current_state']}|{block['plugin_output']}"


def test_nagios4_runs_check_mps_ok_then_critical(monitored: Dict[str, Path]) -> None:
    nagios4 = need("nagios4")
    main, work = nagios_main(monitored), monitored["work"]
    proc = subprocess.Popen([nagios4, str(main)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        def forced(after: float) -> str:
            command(work / "nagios.cmd",
                    f"SCHEDULE_FORCED_SVC_CHECK;gpu01;MPS local;{int(time.time())}")
            return poll("service result", lambda: nagios_result(work / "status.dat", after),
                        60, work / "nagios.log")

        ok = forced(int(time.time()))
        assert ok.startswith("0|MPS OK - "), ok
        kill_and_wait(int(str(monitored["daemon"])))
        time.sleep(1.0)  # a later last_check than the OK one
        bad = forced(int(time.time()))
        assert bad.startswith("2|MPS CRITICAL - daemon-stale node"), bad
    finally:
        stop(proc)


# --- Icinga 2 --------------------------------------------------------------------------

def icinga_conf(monitored: Dict[str, Path]) -> Path:
    base, work = monitored["base"], monitored["work"]
    conf = base / "icinga2.conf"
    conf.write_text(f"""
const PluginDir = "/usr/lib/nagios/plugins"
const NodeName = "monitor.test"
const ZoneName = "master"
object Endpoint NodeName {{}}
object Zone ZoneName {{ endpoints = [ NodeName ] }}
include <itl>
include <plugins>
include "{REPO / 'contrib' / 'icinga2' / 'mps-health.conf'}"
object Host "gpu01" {{
  check_command = "dummy"
  enable_active_checks = false
  vars.mps_gpu_node = true
  vars.mps_plugin = "{monitored['plugin']}"
}}
object CheckerComponent "checker" {{}}
object ExternalCommandListener "command" {{ command_path = "{work}/icinga2.cmd" }}
object PerfdataWriter "perfdata" {{
  service_perfdata_path = "{work}/service-perfdata"
  service_temp_path = "{work}/service-perfdata.tmp"
  host_perfdata_path = "{work}/host-perfdata"
  host_temp_path = "{work}/host-perfdata.tmp"
  service_format_template = "SERVICE::$service.name$\\tSTATE::$service.state_id$\\tCHECKED::$service.last_check$\\tOUTPUT::$service.output$"
  rotation_interval = 1s
}}
""")
    conf.chmod(0o644)
    return conf


def icinga_result(work: Path, checked_after: float) -> Optional[str]:
    """'state|output' of the newest result of service mps checked after ``checked_after``."""
    newest = None
    for path in sorted(work.glob("service-perfdata*")):
        for line in path.read_text(errors="replace").splitlines():
            fields = dict(f.split("::", 1) for f in line.split("\t") if "::" in f)
            if fields.get("SERVICE") == "mps" and float(fields["CHECKED"]) >= checked_after:
                newest = f"{fields['STATE']}|{fields['OUTPUT']}"
    return newest


def test_icinga2_runs_check_mps_ok_then_critical(monitored: Dict[str, Path]) -> None:
    icinga2 = need("icinga2")
    conf, work = icinga_conf(monitored), monitored["work"]
    for sub in ("data", "log", "cache", "spool", "run"):
        (work / sub).mkdir()
        os.chown(work / sub, work.stat().st_uid, work.stat().st_gid)
    argv = [icinga2, "daemon", "-c", str(conf), "-DRunAsUser=nagios", "-DRunAsGroup=nagios",
            *(f"-D{name}={work / sub}" for name, sub in (
                ("DataDir", "data"), ("LogDir", "log"), ("CacheDir", "cache"),
                ("SpoolDir", "spool"), ("InitRunDir", "run"))),
            f"-DPidPath={work / 'run' / 'icinga2.pid'}"]
    log = monitored["base"] / "icinga2.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        def forced(after: float) -> str:
            # Asked again every few seconds: a forced check that arrives while Icinga's
            # own first check of the service runs is dropped.
            for _ in range(12):
                command(work / "icinga2.cmd",
                        f"SCHEDULE_FORCED_SVC_CHECK;gpu01;mps;{int(time.time())}")
                with contextlib.suppress(AssertionError):
                    return poll("service result", lambda: icinga_result(work, after), 5, log)
            raise AssertionError(f"no result of a forced check: {log.read_text()[-3000:]}")

        ok = forced(time.time())
        assert ok.startswith("0|MPS OK - "), ok
        kill_and_wait(int(str(monitored["daemon"])))
        bad = forced(time.time())
        assert bad.startswith("2|MPS CRITICAL - daemon-stale node"), bad
    finally:
        stop(proc)
