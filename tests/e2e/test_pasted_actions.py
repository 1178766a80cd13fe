"""Advice an operator can paste at 3 a.m.: for each fault, every command the check's
action lines quote is run exactly as printed (split as a shell would, never a shell),
and the node is healthy afterwards. Where the fault leaves the daemon working (a dir's
mode or owner, a missing log dir, an event to acknowledge), the daemon, its server and
the connected client are still there afterwards.

On private trees with the fake daemon and a stand-in client (a real process the fake
daemon serves); the check is run with ``--config``, so each pasted command must carry
it to act on the same instance."""

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest
from clirun import mps_health
from mpsdaemon import stop_process
from nodesite import Daemon, Site
from pasted import commands
from remhelp import alive, daemons_of, kill_and_wait, killed_daemon, remediating

CHECKS = "daemon,control,directories,servers"


def node_problems(cfg: str) -> List[dict]:
    """Our instance's problems (other runs' daemons on this machine are node-wide
    findings, not ours)."""
    r = mps_health("check", "--config", cfg, "--only", CHECKS, "--format", "json")
    assert r.returncode in (0, 1, 2, 3), r.stdout + r.stderr
    return [p for p in json.loads(r.stdout)["problems"] if p["instance"] == "node"]


def paste_all(cfg: str) -> List[str]:
    """Run every command the problems' actions quote, as printed; their codes."""
    problems = node_problems(cfg)
    assert problems, "the fault was not seen"
    seen = []
    for p in problems:
        for line in commands(p["action"]):
            words = shlex.split(line)
            assert words[0] == "mps-health" and "--config" in words, (p["code"], line)
            assert words[words.index("--config") + 1] == cfg, line
            if "--dry-run" in words:
                continue  # the advice says: dry run first; the real run follows it
            r = mps_health(*words[1:])
            assert r.returncode == 0, (p["code"], line, r.stdout + r.stderr)
        seen.append(p["code"])
    return seen


@pytest.fixture
def served(site: Site) -> Iterator[Tuple[Daemon, int, subprocess.Popen, str]]:
    """A daemon with a server and a connected client: (daemon, server, client, config)."""
    d = site.start_daemon()
    client = subprocess.Popen(["sleep", "300"])
    server = int(d.query(f"fake_client_connect {client.pid}").stdout)
    cfg = site.config(remediating(site))
    try:
        yield d, server, client, cfg
    finally:
        client.kill()
        client.wait()


def _pipe_mode(site: Site, d: Daemon) -> None:
    site.pipe.chmod(0o700)


def _log_mode(site: Site, d: Daemon) -> None:
    site.log.chmod(0o777)


def _log_gone(site: Site, d: Daemon) -> None:
    for entry in site.log.iterdir():
        entry.unlink()
    site.log.rmdir()


KEEPS_DAEMON: List[Tuple[str, Callable[[Site, Daemon], None], str]] = [
    ("pipe dir 0700", _pipe_mode, "pipe-dir-mode"),
    ("log dir 0777", _log_mode, "log-dir-mode"),
    ("log dir removed", _log_gone, "log-dir-missing"),
]


@pytest.mark.parametrize("label, fault, code", KEEPS_DAEMON, ids=[k[0] for k in KEEPS_DAEMON])
def test_a_dir_fault_pasted_leaves_the_daemon_and_its_client(site: Site, served, label: str,
                                                             fault, code: str) -> None:
    d, server, client, cfg = served
    fault(site, d)
    assert code in paste_all(cfg)
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe) == [d.pid]  # the same daemon: nothing was restarted
    assert alive(server) and client.poll() is None


def test_a_stopped_daemon_pasted_is_healthy_again(site: Site) -> None:
    d = site.start_daemon()
    cfg = site.config(remediating(site))
    stop_process(d.pid)
    try:
        codes = paste_all(cfg)
    finally:
        if alive(d.pid):
            os.kill(d.pid, signal.SIGCONT)
    assert "daemon-stopped" in codes
    # Healthy: the pasted 'kill -CONT' continued the same daemon (its jobs go on).
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe) == [d.pid]


def test_a_dead_daemon_pasted_is_healthy_again(site: Site) -> None:
    cfg = killed_daemon(site)
    codes = paste_all(cfg)
    assert {"daemon-stale", "daemon-absent"} & set(codes), codes
    assert node_problems(cfg) == []
    assert daemons_of(site.pipe)


def test_an_event_pasted_is_acknowledged_until_the_next(site: Site, served) -> None:
    """A server lost under its client: the action names the ack that clears it."""
    d, server, client, cfg = served
    assert node_problems(cfg) == []  # the servers check remembers the server
    d.query(f"fake_server_stop {server} 1")
    time.sleep(0.2)
    codes = paste_all(cfg)
    assert codes == ["server-churn"], codes
    assert node_problems(cfg) == []
    assert client.poll() is None
    assert daemons_of(site.pipe) == [d.pid]


def test_the_pasted_commands_act_on_the_config_given(site: Site, tmp_path: Path) -> None:
    """A config file in a dir with a space: the quoted command splits back to it."""
    d = site.start_daemon()
    spaced = tmp_path / "my site"
    spaced.mkdir()
    cfg = str(spaced / "mps health.yaml")
    Path(cfg).write_text(Path(site.config(remediating(site))).read_text())
    site.pipe.chmod(0o700)
    assert paste_all(cfg) == ["pipe-dir-mode"]
    assert node_problems(cfg) == [] and daemons_of(site.pipe) == [d.pid]


# --- what a refusal, a terminal and a pager print: each command it quotes is one that runs


def parses(command: str) -> None:
    """``command`` (a quoted 'mps-health ...') is one the real parser takes as it is."""
    from mps_health.cli.main import build

    words = shlex.split(command)
    assert words[0] == "mps-health", command
    build(words[1:]).parse_args(words[1:])  # a usage error raises, never exits


def refused_line(out: str) -> str:
    [line] = [ln for ln in out.splitlines() if ln.startswith("  refused: ")]
    return line


def test_a_reset_refused_for_clients_says_what_to_run(site: Site) -> None:
    site.dirs()
    client = subprocess.Popen(["sleep", "300"], env=dict(os.environ, SLURM_JOB_ID="4242"))
    try:
        # The fake names our stand-in as its server's client; a 'log' FIFO made a file is
        # a fault only a restart repairs.
        Daemon(site.pipe, site.log, {"FAKE_MPS_REPLY": str(client.pid)}).start()
        (site.pipe / "log").unlink()
        (site.pipe / "log").write_text("")
        cfg = site.config(remediating(site))
        r = mps_health("remediate", "reset", "--config", cfg)
        assert r.returncode == 1, r.stdout + r.stderr
        line = refused_line(r.stdout)
        quoted = commands(line)
        assert quoted == [f"mps-health remediate drain --reason reset-node --config {cfg}",
                          f"mps-health clients node --config {cfg}",
                          f"mps-health remediate resume --config {cfg}"], line
        for command in quoted:
            parses(command)
        assert "wait until these clients end" in line and "or use --force" in line
        # The one that only looks, pasted: it lists the client the reset waits for.
        shown = mps_health(*shlex.split(quoted[1])[1:])
        assert str(client.pid) in shown.stdout, shown.stdout + shown.stderr
        typo = mps_health("clients", "nod", "--config", cfg)
        assert typo.returncode == 3 and typo.stderr.count("\n") == 1, typo.stderr
        assert "no MPS instance named 'nod' on this node (known: node)" in typo.stderr
    finally:
        client.kill()
        client.wait()


def test_a_reset_refused_for_the_cooldown_names_the_logs_and_the_check_says_so(
        site: Site) -> None:
    site.dirs()
    cfg = site.config(remediating(site), remediation={"cooldown_s": 600})
    first = mps_health("remediate", "reset", "--config", cfg)
    assert first.returncode == 0, first.stdout + first.stderr
    [pid] = daemons_of(site.pipe)
    kill_and_wait(pid)
    control_log, audit = f"{site.log}/control.log", f"{site.root}/audit.log"
    # The alert: its advice is a reset, and it says that reset is refused for now.
    [problem] = node_problems(cfg)
    assert problem["code"] == "daemon-stale", problem
    assert "but a reset is refused until " in problem["action"]
    assert f"read {control_log} and the audit log {audit}" in problem["action"]
    assert "add --force if it must be now" in problem["action"]
    # The reset itself: the same two files, by their paths.
    r = mps_health("remediate", "reset", "--config", cfg)
    assert r.returncode == 1, r.stdout + r.stderr
    line = refused_line(r.stdout)
    assert line.startswith("  refused: cooldown: the last reset on this node was at ")
    assert f"read {control_log} (what the daemon said) and the audit log {audit}" in line
    assert Path(audit).is_file() and "event=begin" in Path(audit).read_text()


def test_a_terminal_shows_each_problem_with_the_command_to_paste(site: Site) -> None:
    from ptyrun import on_pty

    site.start_daemon()
    cfg = site.config(remediating(site))
    site.pipe.chmod(0o700)
    code, lines = on_pty("check", "--config", cfg, "--only", CHECKS, columns=80,
                         env={"NO_COLOR": "1"})
    assert code == 2, lines
    at = next(n for n, ln in enumerate(lines) if ln.startswith("CRITICAL directories[node] "))
    assert lines[at + 1].startswith("  -> run")
    # The command is whole on one line (wider than the terminal: the terminal folds it).
    [command] = [c for ln in lines[at + 1:] if ln.startswith(" ") for c in commands(ln)]
    assert command == f"mps-health remediate dirs node --config {cfg}"
    r = mps_health(*shlex.split(command)[1:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert node_problems(cfg) == []


def test_check_mps_says_what_to_do_on_its_first_line(site: Site) -> None:
    from clirun import check_mps
    from plugin_output import parse

    cfg = killed_daemon(site)
    r = check_mps("--config", cfg, "--only", CHECKS)
    assert r.returncode == 2, r.stdout
    out = parse(r.stdout, 2)
    # One cause, one alert: the dead daemon alone, and what to run for it.
    assert out.text.startswith("daemon-stale node: no live nvidia-cuda-mps-control"), out.text
    assert f" -> run 'mps-health remediate reset node --config {cfg}' (dry run first: " \
        "--dry-run) (runbook: mps-health explain daemon-stale)" in out.text
    assert "; also " not in out.text
    [command] = commands(out.text)
    fixed = mps_health(*shlex.split(command)[1:])
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert check_mps("--config", cfg, "--only", CHECKS).returncode == 0


def test_the_example_config_is_the_default_node(tmp_path: Path) -> None:
    """`mps-health config example` describes the node as it runs without a config file:
    one daemon on /tmp/nvidia-mps; the other layouts are commented alternatives."""
    import yaml
    from mps_health.config.load import load

    r = mps_health("config", "example")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    mps = data["mps"]
    assert (mps["layout"], mps["pipe_dir"], mps["log_dir"]) == (
        "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
    assert "#   layout: per-gpu" in r.stdout and "#   layout: per-job" in r.stdout
    given = load(text=r.stdout, table=None).mps
    assert given == load(text="", table=None).mps  # the example is the defaults
