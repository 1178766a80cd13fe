"""mps_health.remediation.daemonctl: the one way to start and quit a control daemon (fake daemon)."""

import os
from pathlib import Path

from mps_health.remediation import processes
from mps_health.remediation.daemonctl import quit_daemon, start_daemon
from paths import FAKE_CONTROL, fake_binaries


def env_for(pipe: Path, log: Path) -> dict:
    return {"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log)}


def test_start_answers_then_quit_ends_it(site) -> None:
    site.dirs()
    env = env_for(site.pipe, site.log)
    started = start_daemon(FAKE_CONTROL, str(site.pipe), None, env, 10.0)
    assert started.pid is not None, started.detail
    daemon = processes.named_daemon("/proc", str(site.pipe), fake_binaries(), os.geteuid())
    assert daemon is not None and daemon.pid == started.pid
    assert quit_daemon(FAKE_CONTROL, None, env, 1, 6.0) == ""
    assert processes.wait_gone("/proc", (daemon,), 5.0)


def test_a_start_that_brings_up_no_daemon_says_so(site) -> None:
    site.dirs()
    started = start_daemon("/bin/true", str(site.pipe), None,
                           env_for(site.pipe, site.log), 0.5)
    assert started.pid is None and "no daemon in" in started.detail


def test_quit_without_a_daemon_is_a_problem_not_a_hang(site) -> None:
    site.dirs()
    problem = quit_daemon(FAKE_CONTROL, None, env_for(site.pipe, site.log), 1, 5.0)
    assert problem.startswith("'quit -t 1'")
