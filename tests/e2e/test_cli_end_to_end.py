"""End to end: the installed ``mps-health check`` against fake daemons, every exit code."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clirun import installed, mps_health, problem_codes, results, run


def test_healthy_daemon_is_ok(site) -> None:
    site.start_daemon()
    cfg = site.config()
    # strays is skipped: it judges the whole node, where other tests' daemons may run.
    r = mps_health("check", "--config", cfg, "--skip", "tmpfiles,strays")
    assert r.returncode == 0, r.stdout + r.stderr
    # Not a fixed count: every default-on check added (servers, logs, ...) changes it.
    assert r.stdout.startswith("MPS OK - ") and " checks passed on " in r.stdout


def test_stopped_daemon_is_critical_within_timeout(site) -> None:
    d = site.start_daemon()
    cfg = site.config("control:\n  timeout_s: 1.0\n")
    d.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    r = mps_health("check", "--config", cfg, "--format", "json")
    elapsed = time.monotonic() - t0
    d.signal(signal.SIGCONT)
    assert r.returncode == 2
    assert "daemon-stopped" in problem_codes(r)
    # The query it met follows from the stopped daemon: folded under it, not counted.
    (wedged,) = [x for x in results(r, "control") if x["code"] == "control-wedged"]
    assert wedged["cause"] == "daemon-stopped"
    assert elapsed < 10  # bounded; the exact bound is measured in bench/, not asserted here


def test_killed_daemon_is_stale(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    d.signal(signal.SIGKILL)  # returns once it is dead
    r = mps_health("check", "--config", cfg)
    assert r.returncode == 2
    assert "daemon-stale" in r.stdout and "control-absent" not in r.stdout  # one cause
    v = mps_health("check", "--config", cfg, "-v")
    assert "FOLDED control[node] control-absent: " in v.stdout, v.stdout


def test_bad_config_is_one_line_unknown(site) -> None:
    cfg = site.write("bad.yaml", "mps:\n  layout: sideways\n")
    r = mps_health("check", "--config", cfg)
    assert r.returncode == 3
    assert r.stdout == ""
    assert r.stderr.strip() == (f"mps-health: {cfg}: key 'mps.layout': must be one of node, "
                                "per-gpu, per-job (got 'sideways')")


def test_bad_argument_is_unknown_not_critical() -> None:
    r = mps_health("check", "--format", "xml")
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command, args", [
    ("mps-health", ["check", "--format", "xml"]),
    ("mps-health", ["check", "--root", "relative"]),
    ("mps-health", ["check", "--root", "/nonexistent"]),
    ("mps-health", ["check", "--config"]),
    ("mps-health", ["check", "--config", "--only"]),
    ("mps-health", ["check", "--bogus"]),
    ("mps-health", ["healthcheck", "--detached", "--foreground"]),
    ("mps-health", ["healthcheck", "-v"]),
    ("mps-health", ["healthcheck", "--only", "x"]),
    ("mps-health-healthcheck", ["--bogus"]),
    ("mps-health-healthcheck", ["--detached", "--foreground"]),
])
def test_a_bad_option_is_one_line_and_unknown(command: str, args) -> None:
    r = run(command, *args)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.startswith("mps-health"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_the_commands_are_the_installed_entry_points() -> None:
    """pip writes the three commands next to the interpreter, each calling the function
    pyproject.toml names, and the tests run those."""
    for command, call in (("mps-health", "from mps_health.cli.main import main"),
                          ("check_mps", "from mps_health.cli.check_mps import main"),
                          ("mps-health-healthcheck",
                           "from mps_health.cli.main import healthcheck_main")):
        script = installed(command)
        assert Path(script).parent == Path(sys.executable).parent, script
        assert call in Path(script).read_text(), script
    version = subprocess.run([installed("mps-health"), "--version"], capture_output=True,
                             text=True, timeout=60)
    assert (version.returncode, version.stdout.split()[0]) == (0, "mps-health")
    hc = subprocess.run([installed("mps-health-healthcheck"), "--bogus"], capture_output=True,
                        text=True, timeout=60)
    assert hc.returncode == 3 and hc.stderr.startswith("mps-health: ") and hc.stdout == ""


def test_slow_answer_is_warning(site) -> None:
    d = site.start_daemon("slow", FAKE_MPS_DELAY="0.3")
    try:
        # Slow past 0.2 s by the fake's delay; a timeout far past it: never judged wedged.
        cfg = site.config("control:\n  warn_latency_s: 0.2\n  timeout_s: 30\n",
                          pipe=d.pipe_dir, log=d.log_dir)
        r = mps_health("check", "--config", cfg, "--only", "control")
    finally:
        d.stop()
    assert r.returncode == 1, r.stdout
    assert "control-slow" in r.stdout


def test_error_answer_is_critical(site) -> None:
    d = site.start_daemon("err", FAKE_MPS_REPLY='Unknown command "x"')
    try:
        cfg = site.config(pipe=d.pipe_dir, log=d.log_dir)
        r = mps_health("check", "--config", cfg, "--only", "control")
    finally:
        d.stop()
    assert r.returncode == 2
    assert 'control-error: the control daemon answered with an error: Unknown command "x"' in r.stdout


def test_missing_client_is_unknown(site) -> None:
    site.dirs()
    cfg = site.config("commands:\n  nvidia-cuda-mps-control: /nonexistent/x\n")
    r = mps_health("check", "--config", cfg, "--only", "control")
    assert r.returncode == 3
    assert "control-client-missing" in r.stdout


def test_unknown_check_name_is_unknown() -> None:
    r = mps_health("check", "--only", "bogus")
    assert r.returncode == 3
    assert "unknown check 'bogus' (known:" in r.stderr


def test_expected_percentage(site) -> None:
    site.start_daemon(FAKE_MPS_PERCENTAGE="50.0")
    cfg = site.config("control:\n  expected_thread_percentage: 100\n")
    r = mps_health("check", "--config", cfg, "--only", "control")
    assert r.returncode == 1 and "control-percentage" in r.stdout
