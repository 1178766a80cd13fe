"""Output injection: what a user puts in a process's environment or a file name cannot
forge a line or send terminal escapes through any output."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from clirun import mps_health
from conftest import FAKE_CONTROL
from hostile import ATTACKER, as_user, ensure_user, exec_done, public_dir, run_as
from mps_health.model.printable import printable

__all__ = ["public_dir"]  # the fixture, used by name

FORGED = "OK daemon[node]: all good"
EVIL_DIR = f"/tmp/x\n{FORGED}\x1b]0;pwned\x07\x1b[2J\u202e"


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("plain /tmp/nvidia-mps ü") == "plain /tmp/nvidia-mps ü"
    assert printable("a\nb\x1b[2J\x07\u2028\u202e\x9b") == \
        "a\\x0ab\\x1b[2J\\x07\\u2028\\u202e\\x9b"
    assert printable("\t") == "\\x09"


@pytest.fixture
def posing(public_dir: Path) -> Iterator[Path]:
    """A user's process named like MPS's control daemon, with a hostile pipe dir, and a
    file name with escapes in a world-writable pipe dir; returns the config."""
    ensure_user(ATTACKER)
    pipe, log = public_dir / "nvidia-mps", public_dir / "nvidia-log"
    for d in (pipe, log):
        d.mkdir()
        d.chmod(0o777)
    r = run_as(ATTACKER, ["touch", str(pipe / f"x\n{FORGED}\x1b[31m")])
    assert r.returncode == 0, r.stderr
    fake = public_dir / "evil"
    fake.mkdir()
    shutil.copy("/usr/bin/tail", fake / "nvidia-cuda-mps-control")  # "-f": a daemon's flag
    proc = subprocess.Popen([str(fake / "nvidia-cuda-mps-control"), "-f", "/dev/null"],
                            env={"CUDA_MPS_PIPE_DIRECTORY": EVIL_DIR}, **as_user(ATTACKER))
    config = public_dir / "config.yaml"
    config.write_text(f"run_dir: {public_dir}/run\nstate_dir: {public_dir}/state\n"
                      f"commands:\n  nvidia-cuda-mps-control: {FAKE_CONTROL}\n"
                      f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\n")
    exec_done(proc.pid)  # its command line and environment in /proc
    yield config
    proc.kill()
    proc.wait()


def _clean(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(FORGED)], text


@pytest.mark.private_pids  # strays judges every process: only this test's poser is seen
def test_text_json_nagios_and_prometheus_carry_no_forged_line(posing: Path,
                                                               public_dir: Path) -> None:
    only = ("--only", "strays,directories")
    r = mps_health("check", "--config", str(posing), "-v", *only)
    assert r.returncode == 1, r.stdout + r.stderr
    _clean(r.stdout + r.stderr)
    assert "on /tmp/x\\x0aOK daemon[node]: all good\\x1b]0;pwned\\x07" in r.stdout
    assert "x\\x0aOK daemon[node]: all good\\x1b[31m" in r.stdout

    r = mps_health("check", "--config", str(posing), "--format", "json", *only)
    report = json.loads(r.stdout)
    messages = " ".join(p["message"] for p in report["problems"])
    _clean(messages)
    assert "\\x0aOK daemon" in messages

    nagios = subprocess.run([sys.executable, "-c", "from mps_health.cli.check_mps import main;"
                             " raise SystemExit(main())", "--config", str(posing), "-v",
                             "--only", "strays,directories"],
                            capture_output=True, text=True, timeout=60)
    assert nagios.returncode == 1, nagios.stdout + nagios.stderr
    _clean(nagios.stdout)

    out = public_dir / "textfile"
    out.mkdir()
    r = mps_health("exporter", "--config", str(posing), "--textfile", str(out))
    assert r.returncode == 0, r.stderr
    _clean((out / "mps_health.prom").read_text())


def test_drain_reason_and_audit_line_are_escaped() -> None:
    from mps_health.healthcheck.slurmnode import reason_text
    from mps_health.remediation.audit import format_line

    reason = reason_text("MPS-HC:", "pipe-entry-foreign node:", f"x\x1b]0;t\x07{FORGED}")
    assert "\x1b" not in reason and "\x07" not in reason and "\\x1b]0;t\\x07" in reason
    line = format_line({"path": f"/tmp/a\n{FORGED}\x1b[2J"})
    assert "\n" not in line and "\x1b" not in line and "\\x0a" in line


def test_error_lines_and_action_output_are_escaped(public_dir: Path) -> None:
    r = mps_health("check", "--config", str(public_dir / f"c\x1b]0;t\x07\n{FORGED}.yaml"))
    assert r.returncode == 3 and r.stdout == ""
    _clean(r.stderr)
    assert len(r.stderr.splitlines()) == 1
    pipe, log = public_dir / "pipe", public_dir / "log"
    for d in (pipe, log):
        d.mkdir(mode=0o777)
        d.chmod(0o777)
    r = run_as(ATTACKER, ["touch", str(pipe / f"x\n{FORGED}\x1b[31m")])
    assert r.returncode == 0, r.stderr
    config = public_dir / "config.yaml"
    config.write_text(f"run_dir: {public_dir}/run\nstate_dir: {public_dir}/state\n"
                      f"mps:\n  pipe_dir: {pipe}\n  log_dir: {log}\nremediation:\n"
                      f"  audit_log: {public_dir}/audit.log\n  syslog: false\n"
                      f"commands:\n  nvidia-cuda-mps-control: {FAKE_CONTROL}\n")
    r = mps_health("remediate", "reset", "--dry-run", "--config", str(config))
    _clean(r.stdout + r.stderr)
    assert "x\\x0aOK daemon[node]: all good\\x1b[31m" in r.stdout
