"""check_mps end to end against fake daemons: every state, checked by the strict grammar.

Where a test needs a clean OK it skips the check that judges the whole node's daemons
(``node_wide_check()``): on a shared test machine other fake daemons may run, and that
check rightly warns about them (daemon-unexpected).
"""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from clirun import check_mps, mps_health
from monitoring_tools import node_wide_check
from mps_health.cli import check_mps as plugin
from plugin_output import parse


def test_healthy_daemon_is_ok_with_perfdata(site) -> None:
    site.start_daemon()
    cfg = site.config()
    r = check_mps("--config", cfg, "--skip", node_wide_check())
    assert r.returncode == 0, r.stdout + r.stderr
    out = parse(r.stdout, r.returncode)
    print(r.stdout)
    assert (out.service, out.separator) == ("MPS", " - ")
    assert re.match(r"\d+ checks passed on \S+ in \d+\.\d\ds \Z", out.text), out.text
    latency = out.perf("node_latency")
    # -w/-c from control.warn_latency_s (the test site's: no latency judged on a busy
    # machine); the defaults 0.5 and 1 are tests/unit/test_nagios_check.py's.
    assert (latency.uom, latency.warn, latency.crit, latency.min) == ("s", "60", "120", "0")
    assert 0 < float(latency.value) < 5
    assert out.perf("node_dir_ok")[1:] == ("1", "", "", "", "0", "1")
    assert out.long_lines == [] and r.stderr == ""


def test_check_mps_counts_the_passed_checks_as_the_check_does(site) -> None:
    """One node, one count: an operator comparing the plugin with `mps-health check`
    must not see 8 against 9 (the directories check passes twice: pipe and log dir)."""
    site.start_daemon()
    cfg = site.config()
    plugin_run = check_mps("--config", cfg, "--skip", node_wide_check())
    check_run = mps_health("check", "--config", cfg, "--skip", node_wide_check())
    counts = [re.search(r" (\d+) checks? passed on ", r.stdout) for r in (plugin_run, check_run)]
    assert all(counts), plugin_run.stdout + check_run.stdout
    assert counts[0].group(1) == counts[1].group(1)  # type: ignore[union-attr]


def test_daemon_up_is_in_the_perfdata(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    # strays skipped: other tests' daemons on this machine are strays to this config
    r = check_mps("--config", cfg, "--skip", "strays")
    out = parse(r.stdout, r.returncode)
    assert (r.returncode, out.state) == (0, "OK"), r.stdout
    assert out.perf("node_daemon_up")[1:] == ("1", "", "", "", "0", "1")
    d.stop()
    r = check_mps("--config", cfg, "--skip", "strays")
    out = parse(r.stdout, r.returncode)
    assert (r.returncode, out.state) == (2, "CRITICAL"), r.stdout
    assert out.perf("node_daemon_up").value == "0"


# The fake answers after its delay, however much later a loaded machine makes it: a
# control timeout well past it keeps a slow answer from being judged a wedged daemon.
SLOW_NOT_WEDGED = "control:\n  timeout_s: 30\n"


def test_slow_answer_is_warning_by_the_w_range(site) -> None:
    site.start_daemon(FAKE_MPS_DELAY="1.0")
    cfg = site.config(SLOW_NOT_WEDGED)
    r = check_mps("--config", cfg, "--only", "control", "-w", "0.8", "-c", "30")
    assert r.returncode == 1, r.stdout
    out = parse(r.stdout, r.returncode)
    print(r.stdout)
    # The status line names the code, not the perfdata label (node_latency).
    assert out.text.startswith("control-slow node: latency ") and "outside range 0:0.8" in out.text
    assert out.perf("node_latency")[3:5] == ("0.8", "30")


def test_slow_answer_is_critical_by_the_c_range(site) -> None:
    site.start_daemon(FAKE_MPS_DELAY="1.0")
    cfg = site.config(SLOW_NOT_WEDGED)
    r = check_mps("--config", cfg, "--only", "control", "-w", "0.2", "-c", "@0.5:60")
    assert r.returncode == 2, r.stdout
    assert parse(r.stdout, 2).perf("node_latency").crit == "@0.5:60"


def test_stopped_daemon_is_critical_inside_the_timeout(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    d.signal(signal.SIGSTOP)
    try:
        r = check_mps("--config", cfg, "-t", "2", "-v")  # budget 1.4s < control.timeout_s 2
    finally:
        d.signal(signal.SIGCONT)
    assert r.returncode == 2, r.stdout  # CRITICAL, not the plugin's own UNKNOWN timeout
    out = parse(r.stdout, 2)
    print(r.stdout)
    assert out.text.startswith("daemon-stopped node:"), out.text
    long_text = "\n".join(out.long_lines)
    # The wedge follows from the stopped daemon: said, folded under it, not counted.
    assert "FOLDED control[node] control-wedged: the control daemon did not answer within " \
        "1.1s" in long_text
    # What to do is on the status line (what a pager shows), and the command pasted acts
    # on the instance judged: the run's --config goes with it.
    assert f"'mps-health remediate unblock node --config {cfg}'" in out.text
    assert f"'mps-health remediate unblock node --config {cfg}'" in long_text
    # A stopped daemon runs but serves no one: not up (the fleet alert counts it).
    assert out.perf("node_daemon_up").value == "0"


def test_bad_config_is_unknown(site) -> None:
    cfg = site.write("bad.yaml", "mps:\n  layout: sideways\n")
    r = check_mps("--config", cfg)
    assert r.returncode == 3
    assert r.stdout == (f"MPS UNKNOWN - {cfg}: key 'mps.layout': must be one of node, per-gpu, "
                        "per-job (got 'sideways')\n")
    parse(r.stdout, 3)


@pytest.mark.parametrize("args, says", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-w", "abc"], "invalid range 'abc'"),
    (["-c", "5:1"], "invalid range '5:1'"),
    (["-t", "0"], "timeout 0 out of range"),
    (["-t", "2.5"], "whole seconds"),
    (["--only", "nope"], "unknown check 'nope'"),
    # absurd thresholds: one line, never "internal error"
    (["-w", "1e29"], "invalid range '1e29'"),
    (["-w", "1.0e29"], "range '1.0e29' out of bounds: latency thresholds are seconds from 0 "
                       "to 3600"),
    (["-c", "99999999999999999999999999999999"], "out of bounds"),
    (["-w", "9" * 400], "invalid range '" + "9" * 40 + "'"),  # beyond a float
    (["-w", "1.0e400"], "invalid range '1.0e400'"),
    (["-c", "@1.0e400:"], "invalid range '@1.0e400:'"),
    (["-w", "nan"], "invalid range 'nan'"),
    (["-w", "nan."], "invalid range 'nan.'"),
    (["--warning=-1:2"], "range '-1:2' out of bounds"),
    (["--critical=~:-1"], "range '~:-1' out of bounds"),
    (["-w", "3601"], "range '3601' out of bounds"),
])
def test_bad_arguments_are_unknown_not_critical(args, says) -> None:
    r = check_mps(*args)
    assert r.returncode == 3, r.stdout
    assert says in r.stdout and r.stdout.count("\n") == 1 and r.stderr == ""
    assert parse(r.stdout, 3).state == "UNKNOWN"


def test_help_and_version_exit_unknown_as_monitoring_plugins_do() -> None:
    h = check_mps("-h")
    assert h.returncode == 3 and h.stdout.startswith("usage: check_mps")
    for option in ("-w RANGE", "-c RANGE", "-t SECONDS", "--only A,B", "--config FILE"):
        assert option in h.stdout
    v = check_mps("-V")
    assert v.returncode == 3 and v.stdout.startswith("check_mps v")


def test_console_script_is_installed() -> None:
    script = shutil.which("check_mps", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("check_mps is not installed next to this python")
    r = subprocess.run([script, "-V"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and r.stdout.startswith("check_mps v")


@pytest.mark.parametrize("verbose", [[], ["-vv"]])
def test_plugin_timeout_is_unknown(site, monkeypatch: pytest.MonkeyPatch, verbose) -> None:
    """A run that overruns -t is the plugin's own UNKNOWN (the Probe's CheckError), in one
    line, at -t, with -v too."""
    import time

    from mps_health.engine import run as engine

    def hung(*args, **kwargs):
        time.sleep(30)  # a probe that never returns (its thread is left behind)

    monkeypatch.setattr(engine, "gather", hung)
    text, code = plugin.run(["--config", site.write("c.yaml", "{}\n"), "-t", "1", *verbose])
    assert code == 3
    assert text == ("MPS UNKNOWN - check_mps timed out after 1s before the checks finished "
                    "(raise -t, or look for a hung process on the node)\n")
    parse(text, 3)


def test_config_thresholds_that_print_in_exponent_form_are_taken(site) -> None:
    """The default -w/-c come from control.warn_latency_s as numbers: 1e-05 and .inf are
    thresholds, not "internal error"."""
    site.start_daemon()
    for value, perf in (("0.00001", ";0.00001;0.00002;0"), (".inf", ";;;0"),
                        ("2", ";2;4;0")):
        cfg = site.config(f"control:\n  warn_latency_s: {value}\n")
        r = check_mps("--config", cfg, "--only", "control")
        assert r.returncode in (0, 1, 2), r.stdout
        assert "internal error" not in r.stdout
        latency = next(p for p in r.stdout.split("|")[1].split() if p.startswith("node_lat"))
        assert latency.endswith("s" + perf), r.stdout


def test_two_runs_in_one_process_do_not_pile_up(site) -> None:
    """Two runs in one process each print their own perfdata, never piled up."""
    site.start_daemon()
    args = ["--config", site.config(), "--only", "control"]
    first, second = plugin.run(args), plugin.run(args)
    assert first[1] == second[1] == 0
    labels = [p.label for p in parse(*first).perfdata]
    assert labels == ["node_control_thread_percentage", "node_latency"]
    assert [p.label for p in parse(*second).perfdata] == labels


def test_output_stays_under_8k_with_many_instances(site) -> None:
    cfg = site.config(mps={"layout": "per-gpu", "pipe_dir": f"{site.root}/pipe_{{gpu}}",
                           "log_dir": f"{site.root}/log_{{gpu}}", "gpus": list(range(300))})
    # 300 instances: the plugin's hard time limit (-t) is set high, since this is about
    # the output's size and a loaded CI machine is slow.
    r = check_mps("--config", cfg, "--skip", "control", "-v", "-t", "120")
    assert r.returncode == 2, r.stdout + r.stderr
    out = parse(r.stdout, 2)  # under 8 KiB, every perfdata item whole
    assert out.text.startswith("daemon-absent gpu0: no nvidia-cuda-mps-control serves")
    # nagiosplugin's layout with -v: the perfdata is the last line, after the long output.
    assert r.stdout.splitlines()[-1].startswith("| ")
    assert out.long_lines[-2].startswith("... ") and "more lines cut" in out.long_lines[-2]
    assert out.perf("gpu0_daemon_up").value == "0"
    assert len(r.stdout.encode()) > 6000  # it did fill the space it had


@pytest.mark.parametrize("argv, given", [
    ([], {"warning": None, "critical": None, "timeout": 10, "only": [], "skip": [],
          "config": None, "root": "/", "verbose": 0}),
    (["-w", "0.8", "-c", "30"], {"warning": "0.8", "critical": "30"}),
    (["--warning=@0.5:60", "-t", "5", "-v"], {"warning": "@0.5:60", "timeout": 5, "verbose": 1}),
    (["--only", "control,daemon", "--skip=tmpfiles", "--config", "/etc/x.yaml", "-vv"],
     {"only": ["control", "daemon"], "skip": ["tmpfiles"], "config": "/etc/x.yaml",
      "verbose": 2}),
    (["-v", "-v", "--timeout=3600", "--root", "/srv/node"],
     {"verbose": 2, "timeout": 3600, "root": "/srv/node"}),
    (["-c", "~:2"], {"critical": "~:2"}),
])
def test_the_usual_arguments_read_as_documented(argv, given) -> None:
    args = vars(plugin.parser().parse_args(argv))
    assert {k: args[k] for k in given} == given


@pytest.mark.parametrize("argv", [["-t"], ["-w", "-1:1"], ["--only"], ["-t", "1", "-t"]])
def test_an_option_without_its_value_is_one_unknown_line(argv) -> None:
    r = check_mps(*argv)
    assert r.returncode == 3 and r.stderr == "", r.stdout + r.stderr
    assert r.stdout.startswith("MPS UNKNOWN - ") and r.stdout.count("\n") == 1, r.stdout
