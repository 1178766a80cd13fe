"""contrib/ checked by the real tools: systemd-analyze verify (units), systemd-tmpfiles
--cat-config (guard), the NHC shim sourced as NHC does, the config example through
mps-health's own loaders, and the RPM spec through rpmbuild and rpm -qlp."""
# ruff: noqa: F811  (fixtures come from remhelp and fleethelp)

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import argv, mps_health
from conftest import FAKE_CONTROL, REPO
from fleethelp import CONTRIB, dists, need  # noqa: F401
from mpsdaemon import start_daemon
from nodesite import Site

UNITS = ("nvidia-mps.service", "nvidia-mps@.service", "mps-health-exporter.service",
         "mps-health-textfile.service", "mps-health-textfile.timer")


def _unit_root(base: Path) -> Path:
    """A root with systemd's own units, our units and stand-ins for the programs they run
    (systemd-analyze verify checks that each ExecStart program exists)."""
    root = base / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    # mps-health where the README's install links it; the units name it without a path.
    for path in ("usr/local/sbin/mps-health", "usr/bin/nvidia-cuda-mps-control"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("#!/bin/sh\nexit 0\n")
        (root / path).chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(CONTRIB / "systemd" / unit, root / "etc/systemd/system" / unit)
    return root


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess:
    # --man stays on: a Documentation=man: page no node has is an error (none is named:
    # the units name the README, file:/opt/mps-health/README.md, which the installs link).
    return subprocess.run([need("systemd-analyze"), "verify", f"--root={root}",
                           *units], capture_output=True, text=True, timeout=60)


def test_units_verify(site) -> None:
    if not Path("/usr/lib/systemd/system/sysinit.target").exists():
        pytest.skip("systemd's own units are not installed (apt-get install systemd)")
    root = _unit_root(site.root)
    r = _verify(root, "nvidia-mps.service", "nvidia-mps@0.service",
                "mps-health-exporter.service", "mps-health-textfile.service",
                "mps-health-textfile.timer")
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    # The same run does judge the files: a typo and a missing program are reported.
    bad = root / "etc/systemd/system/nvidia-mps@.service"
    bad.write_text(bad.read_text().replace("Type=forking", "Type=forkin"))
    (root / "usr/local/sbin/mps-health").unlink()
    r = _verify(root, "nvidia-mps@0.service")
    assert "Failed to parse service type" in r.stderr
    assert "Command mps-health is not executable" in r.stderr
    # The packages' /usr/sbin is searched too.
    (root / "usr/sbin").mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "usr/bin/nvidia-cuda-mps-control", root / "usr/sbin/mps-health")
    r = _verify(root, "nvidia-mps.service", "mps-health-exporter.service")
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("unit, pipe, log, extra", [
    ("nvidia-mps@.service", "/tmp/nvidia-mps_%i", "/var/log/nvidia-mps_%i",
     ["Environment=CUDA_VISIBLE_DEVICES=%i"]),
    ("nvidia-mps.service", "/tmp/nvidia-mps", "/var/log/nvidia-mps", []),
])
def test_mps_unit_lines(unit: str, pipe: str, log: str, extra: list) -> None:
    """Each unit matches its layout's defaults in mps-health's config."""
    text = (CONTRIB / "systemd" / unit).read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    for want in ("Type=forking", *extra,
                 f"Environment=CUDA_MPS_PIPE_DIRECTORY={pipe}",
                 f"Environment=CUDA_MPS_LOG_DIRECTORY={log}",
                 f"PIDFile={pipe}/nvidia-cuda-mps-control.pid",
                 "ExecStart=/usr/bin/nvidia-cuda-mps-control -d",
                 "ExecStartPre=mps-health unit prepare"):
        assert want in lines
    assert not any("/bin/sh" in line for line in lines)  # no shell anywhere
    if unit == "nvidia-mps.service":
        from mps_health.config.load import from_mapping

        mps = from_mapping({}, None).mps  # no config file: the node layout
        assert (mps.layout, mps.pipe_dir, mps.log_dir) == ("node", pipe, log)


def test_unit_helpers_on_fake_daemon(site, fake_path: str) -> None:
    """ExecStartPre and ExecStop as the unit runs them: env from Environment=, no shell."""
    pipe, log = site.root / "nvidia-mps_0", site.root / "nvidia-mps-log_0"
    os.symlink("/etc", pipe)  # planted in /tmp: moved aside, never followed
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    cfg = site.write("unit.yaml", f"state_dir: {site.state_dir}\n")
    r = mps_health("unit", "prepare", "--config", str(cfg), env=env, timeout=30)
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and "aside" in r.stdout
    assert not pipe.is_symlink() and (pipe.stat().st_mode & 0o7777) == 0o777
    assert oct(os.stat("/etc").st_mode & 0o7777) != "0o777"
    pid = start_daemon(pipe, log)
    r = mps_health("unit", "stop", "--control", FAKE_CONTROL, "--timeout", "10", "--config",
                   str(cfg), env=env, timeout=30)
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and f"control daemon {pid}" in r.stdout
    # Both recorded as planned: the servers check does not call them daemon-restarted.
    from mps_health.hostio.planned import load

    records, error = load(str(site.state_dir))
    assert error == "" and [(p.pipe_dir, p.by) for p in records] == \
        [(str(pipe), "unit start"), (str(pipe), "unit stop")]
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    r = mps_health("unit", "stop", env=env, timeout=30)
    assert r.returncode == 0 and "nothing to stop" in r.stdout
    r = mps_health("unit", "stop", env={"PATH": os.environ["PATH"]}, inherit=False,
                   timeout=30)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "CUDA_MPS_PIPE_DIRECTORY" in r.stderr


def test_tmpfiles_guard_cat_config(site) -> None:
    root = site.root / "root"
    (root / "usr/lib/tmpfiles.d").mkdir(parents=True)
    shutil.copy(CONTRIB / "systemd/tmpfiles.d/mps-health.conf", root / "usr/lib/tmpfiles.d")
    r = subprocess.run([need("systemd-tmpfiles"), "--cat-config", f"--root={root}"],
                       capture_output=True, text=True, timeout=30)
    print(r.stdout)
    assert r.returncode == 0
    assert f"# {root}/usr/lib/tmpfiles.d/mps-health.conf" in r.stdout
    assert "x /tmp/nvidia-mps_*" in r.stdout
    # What 'remediate tmpfiles-guard' writes in /etc replaces the packaged file.
    (root / "etc/tmpfiles.d").mkdir(parents=True)
    (root / "etc/tmpfiles.d/mps-health.conf").write_text("x /tmp/site-mps_*\n")
    r = subprocess.run([need("systemd-tmpfiles"), "--cat-config", f"--root={root}"],
                       capture_output=True, text=True, timeout=30)
    assert "x /tmp/site-mps_*" in r.stdout and "x /tmp/nvidia-mps_*" not in r.stdout
    # Every default layout's paths are guarded, as 'remediate tmpfiles-guard' would.
    from mps_health.checks.tmpfiles import guarded
    from mps_health.config.load import from_mapping
    from mps_health.probes.tmpfiles import parse_tmpfiles
    from mps_health.remediation.tmpfiles_guard import guarded_paths

    rules, errors = parse_tmpfiles(
        (CONTRIB / "systemd/tmpfiles.d/mps-health.conf").read_text(), "mps-health.conf")
    assert errors == [] or errors == ()
    for layout in ("node", "per-gpu", "per-job"):
        mps = from_mapping({"mps": {"layout": layout, "gpus": [0, 1, 7]}}, None).mps
        samples = [p.replace("*", "1234") for p in guarded_paths(mps)]
        assert samples and all(guarded(tuple(rules), p) for p in samples), layout


NHC_HARNESS = r"""
# What NHC gives a check (mej/nhc): die RC MSG records the failure (here, as NHC's
# check-all mode does, it returns), log and dbg write the log; scripts are sourced.
CHECK_DIE_MSG=""; DIE_RC=""
function die() { DIE_RC="$1"; shift; CHECK_DIE_MSG="$*"; echo "ERROR: nhc: Health check failed: $*" >> "$LOG"; return "$DIE_RC"; }
function log() { echo "$*" >> "$LOG"; }
function dbg() { [[ -n "$DEBUG" ]] && echo "DEBUG: $*" >> "$LOG"; return 0; }
PATH=/sbin:/usr/sbin:/bin:/usr/bin
source "$SHIM"
check_mps_health "$@"
RC=$?
echo "rc=$RC"
echo "die=$DIE_RC"
echo "msg=$CHECK_DIE_MSG"
"""


def _nhc(site: Site, config: str, *args: str) -> dict:
    prog = site.root / "mps-health"
    # A wrapper with this interpreter: NHC's PATH has no mps-health of ours.
    prog.write_text(f"#!/bin/sh\nexec {shlex.join(argv('mps-health'))} \"$@\"\n")
    prog.chmod(0o755)
    env = {"SHIM": str(CONTRIB / "nhc/mps_health.nhc"), "LOG": str(site.root / "nhc.log"),
           "MPS_HEALTH": str(prog), "DEBUG": "1",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(["bash", "-c", NHC_HARNESS, "nhc", "-c", config, *args], env=env,
                       capture_output=True, text=True, timeout=60)
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    out["log"] = (site.root / "nhc.log").read_text() if (site.root / "nhc.log").exists() else ""
    print(out)
    return out


def test_nhc_shim(site) -> None:
    pipe, log = site.dirs()
    config = site.config(commands={"nvidia-cuda-mps-control": FAKE_CONTROL},
                         checks={"only": ["daemon", "control", "directories"]})
    pid = start_daemon(pipe, log)
    healthy = _nhc(site, str(config))
    assert healthy["rc"] == "0" and healthy["die"] == ""
    os.kill(pid, signal.SIGKILL)
    broken = _nhc(site, str(config))
    assert broken["rc"] == "1" and broken["die"] == "1"
    assert broken["msg"].startswith("check_mps_health:  CRITICAL daemon[node] daemon-stale: ")
    assert " -> " not in broken["msg"]  # the action goes to the log only
    assert "remediate reset" in broken["log"]
    bad = site.write("bad.yaml", "mps:\n  layout: sideways\n")
    unknown = _nhc(site, str(bad))
    assert unknown["rc"] == "0" and "layout" in unknown["log"]  # logged, not a failure
    unknown = _nhc(site, str(bad), "-u")
    assert unknown["rc"] == "1" and "mps.layout" in unknown["msg"]
    (pipe / "nvidia-cuda-mps-control.pid").unlink()
    os.kill(start_daemon(pipe, log), signal.SIGSTOP)  # never answers: bounded by -t
    wedged = _nhc(site, str(config), "-t", "3")
    assert wedged["rc"] == "1"
    assert any(w in wedged["msg"] for w in ("daemon-stopped", "control-wedged",
                                            "did not finish within 3s")), wedged


def test_config_example_loads() -> None:
    """Every key of every declared section is in the example, and the example loads."""
    import yaml
    from mps_health.config import load as core_config

    path = str(CONTRIB / "config.example.yaml")
    c = core_config.load(path, table=None)
    raw = yaml.safe_load(Path(path).read_text())
    declared = {s.name: s.record._fields for s in core_config.CORE_SECTIONS}
    for name, owner in core_config.SECTIONS.items():
        declared[name] = {s.name: s for s in owner()}[name].record._fields
    for name, keys in declared.items():
        assert set(raw[name]) == set(keys), name
    assert set(raw) == set(declared) | set(core_config.TOP_KEYS)
    # The node without a config file (contrib/systemd/nvidia-mps.service); the other
    # layouts are commented alternatives.
    assert c.mps == core_config.load(text="", table=None).mps
    assert "#   layout: per-gpu" in Path(path).read_text()


def _spec_wheels(dest: Path) -> None:
    """The wheels the spec bundles (its Source lines), downloaded with pip; skips offline."""
    import re

    spec = (CONTRIB / "rpm/mps-health.spec").read_text()
    pins = [f"{m[0]}=={m[1]}" for m in re.findall(r"^Source\d+:\s+(\w+)-([\w.]+)-py3-none-any\.whl$",
                                                   spec, re.M)]
    assert len(pins) == 3, pins
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--dest", str(dest), *pins], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot download {pins} (no PyPI?): {r.stderr.strip().splitlines()[-1:]}")


def test_rpm_builds_bundles_and_lists(dists, tmp_path: Path) -> None:
    """The RPM carries everything it imports (RHEL's PyYAML and Jinja2 as Requires, the
    rest bundled in /opt/mps-health), the example config only as documentation, and
    nothing that points into the build root; its payload runs."""
    rpmbuild = need("rpmbuild")
    src = tmp_path / "sources"
    src.mkdir()
    shutil.copy(dists.sdist, src)
    _spec_wheels(src)
    # --nodeps: Debian's rpm database is empty; BuildRequires are for RHEL builders.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    r = subprocess.run([rpmbuild, "-bb", "--nodeps", "--define", f"_topdir {tmp_path}",
                        "--define", f"_sourcedir {src}", str(CONTRIB / "rpm/mps-health.spec")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rpms = list((tmp_path / "RPMS/noarch").glob("mps-health-0.1.0-1*.noarch.rpm"))
    assert len(rpms) == 1
    files = subprocess.run(["rpm", "-qlp", str(rpms[0])], capture_output=True, text=True,
                           check=True).stdout.split()
    print("\n".join(f for f in files if "/site-packages/" not in f))
    expected = {
        "/usr/sbin/mps-health", "/usr/sbin/mps-health-healthcheck",
        "/usr/lib64/nagios/plugins/check_mps", "/opt/mps-health/bin/python3",
        "/opt/mps-health/pyvenv.cfg", "/usr/share/doc/mps-health/config.example.yaml",
        "/usr/lib/systemd/system/nvidia-mps.service",
        "/usr/lib/systemd/system/nvidia-mps@.service",
        "/usr/lib/systemd/system/mps-health-exporter.service",
        "/usr/lib/systemd/system/mps-health-textfile.service",
        "/usr/lib/systemd/system/mps-health-textfile.timer",
        "/usr/lib/tmpfiles.d/mps-health.conf", "/usr/libexec/mps-health/mps-health-prolog",
        "/usr/libexec/mps-health/mps-health-task-prolog",
        "/usr/libexec/mps-health/mps-health-epilog",
        "/usr/share/mps-health/nhc/mps_health.nhc", "/var/lib/mps-health",
        "/var/log/mps-health", "/etc/mps-health",
    }
    assert expected <= set(files), expected - set(files)
    assert "/etc/mps-health/config.yaml" not in files  # no live config: the defaults apply
    for bundled in ("/mps_health/remediation/unit.py", "/mps_health/slurm/templates/hook.j2",
                    "/prometheus_client/__init__.py", "/pynvml.py", "/nagiosplugin/__init__.py"):
        assert any(f.startswith("/opt/mps-health/lib/") and f.endswith(bundled)
                   for f in files), bundled
    conf = subprocess.run(["rpm", "-qp", "--configfiles", str(rpms[0])], capture_output=True,
                          text=True, check=True).stdout.split()
    assert conf == []
    requires = subprocess.run(["rpm", "-qp", "--requires", str(rpms[0])], capture_output=True,
                              text=True, check=True).stdout.splitlines()
    assert {"python3-pyyaml", "python3-jinja2", "python3 >= 3.9"} <= set(requires), requires

    need("cpio")
    root = tmp_path / "payload"
    root.mkdir()
    payload = subprocess.run(["rpm2cpio", str(rpms[0])], capture_output=True, check=True).stdout
    subprocess.run(["cpio", "-idm", "--quiet"], input=payload, cwd=root, check=True)
    leaked = subprocess.run(["grep", "-rlI", str(tmp_path / "BUILDROOT"), str(root)],
                            capture_output=True, text=True)
    assert leaked.stdout == ""  # no #! line, pyvenv.cfg or record points into the build root
    hook = (root / "usr/libexec/mps-health/mps-health-prolog").read_text()
    assert hook.startswith("#!/opt/mps-health/bin/python3 -I\n# mps-health Slurm prolog")
    assert (root / "opt/mps-health/bin/check_mps").read_text().startswith(
        "#!/opt/mps-health/bin/python3\n")
    # The payload's own Python (this machine's python3, as on the builder), isolated from
    # this test's environment: every import is met by the bundle or the Requires.
    python = str(root / "opt/mps-health/bin/python3")
    r = subprocess.run([python, "-I", "-c", "import mps_health.cli.check_mps, "
                        "prometheus_client, pynvml, yaml, jinja2, nagiosplugin; print(pynvml.__file__)"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.startswith(str(root / "opt/mps-health/lib")), r
    r = subprocess.run([python, "-I", str(root / "opt/mps-health/bin/mps-health"), "check",
                        "--replay", str(REPO / "examples/broken-node.json")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and r.stdout.startswith("MPS CRITICAL - 2 problems"), r


def test_monitoring_definitions_use_the_installed_plugin_paths() -> None:
    """The NRPE line, Nagios's default _MPS_PLUGIN and Icinga's mps_plugin are where the
    README's install links check_mps; the packages' paths are named only in comments."""
    readme = (CONTRIB.parent / "README.md").read_text()
    assert "ln -sf /opt/mps-health/bin/check_mps /usr/local/lib/nagios/plugins/" in readme
    plugin = "/usr/local/lib/nagios/plugins/check_mps"
    nagios = (CONTRIB / "nagios/mps-health.cfg").read_text()
    assert f"_MPS_PLUGIN             {plugin}\n" in nagios
    assert f"command[check_mps]={plugin} -w 0.5 -c 1 -t 20" in nagios
    assert nagios.count("$_HOSTMPS_PLUGIN$ -w $ARG1$ -c $ARG2$ -t 20") == 2
    icinga = (CONTRIB / "icinga2/mps-health.conf").read_text()
    assert f'  vars.mps_plugin = "{plugin}"\n' in icinga
    links = (CONTRIB / "debian/mps-health.links").read_text().split()
    assert links[links.index("opt/mps-health/bin/check_mps") + 1] \
        == "usr/lib/nagios/plugins/check_mps"
    spec = (CONTRIB / "rpm/mps-health.spec").read_text()
    assert "ln -s %{venv}/bin/check_mps %{buildroot}%{plugindir}/check_mps" in spec
    for text in (nagios, icinga):
        assert "/usr/local/bin/check_mps" not in text
        code = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("#", "*", "/*"))]
        assert not [ln for ln in code if "/usr/lib/nagios" in ln or "/usr/lib64/nagios" in ln]
