"""limits, end to end on the fake daemon: a default changed while a server runs is not in
force for it (reported with both values, cleared once a new server starts), and default
pinned limits set on one GPU by index and by UUID, or on an ID naming no GPU, are named
from control.log. Real client processes (sleep) stand in for CUDA clients."""

import json
import subprocess
from typing import Iterator, List

import pytest
from clirun import mps_health

UUID = "GPU-05803005-9e7a-c129-2f1f-b83ee0421857"  # the fake daemon's GPU (the H200's)


@pytest.fixture
def sleepers() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def client(procs: List[subprocess.Popen]) -> int:
    p = subprocess.Popen(["sleep", "120"])
    procs.append(p)
    return p.pid


def check(cfg: str) -> dict:
    r = mps_health("check", "--config", cfg, "--only", "limits", "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def problems(data: dict) -> List[tuple]:
    return [(p["code"], p["message"]) for p in data["problems"]]


def values(data: dict) -> dict:
    """Every value of the run by key (one GPU here, so the UUID label is not needed)."""
    out: dict = {}
    for run in data["checks"]:
        for r in run["results"]:
            out.update(r["values"])
    return out


def test_a_default_changed_under_a_running_server(site, sleepers) -> None:
    d = site.start_daemon(FAKE_MPS_PERCENTAGE="100.0")
    cfg = site.config()
    d.query("set_default_device_pinned_mem_limit 0 4G")
    first = d.query(f"fake_client_connect {client(sleepers)} 0").stdout.strip()
    assert problems(check(cfg)) == []
    d.query("set_default_active_thread_percentage 50")
    d.query("set_default_device_pinned_mem_limit 0 2G")
    data = check(cfg)
    found = problems(data)
    assert [c for c, _m in found] == ["limits-not-in-force", "limits-not-in-force"]
    assert f"server {first} (" in found[0][1]
    assert "applies 100% active threads, the default is 50% (set after it started)" \
        in found[0][1]
    assert f"applies a pinned memory limit of 4G on GPU {UUID}, the default is 2G" in found[1][1]
    assert d.query("get_default_device_pinned_mem_limit 0").stdout == "2G\n"
    # The server's clients end, it ends; the next client's new server has the defaults.
    sleepers[0].kill()
    sleepers[0].wait()
    d.query(f"fake_server_stop {first}")
    second = d.query(f"fake_client_connect {client(sleepers)} 0").stdout.strip()
    assert second != first
    assert d.query(f"get_active_thread_percentage {second}").stdout == "50.0\n"
    assert problems(check(cfg)) == []


def test_metrics_carry_both_values(site, sleepers) -> None:
    d = site.start_daemon(FAKE_MPS_PERCENTAGE="100.0")
    cfg = site.config()
    d.query(f"fake_client_connect {client(sleepers)} 0")
    d.query("set_default_active_thread_percentage 40")
    d.query("set_default_device_pinned_mem_limit 0 1G")
    log = d.log_dir / "control.log"
    before = log.read_text()
    r = mps_health("check", "--config", cfg, "--only", "limits", "-v")
    assert r.returncode == 1 and "limits-not-in-force" in r.stdout, r.stdout + r.stderr
    # Nothing asked twice: the run's one control query gives the default percentage, the
    # servers' one device_query the device table.
    asked = log.read_text()[len(before):]
    assert asked.count("Cmd:get_default_active_thread_percentage\n") == 1
    assert asked.count("Cmd:device_query\n") == 1
    seen = values(check(cfg))
    assert seen["default_thread_percentage"] == 40.0
    assert seen["applied_thread_percentage"] == 100.0
    assert seen["default_pinned_mem_limit_bytes"] == float(1 << 30)
    assert "applied_pinned_mem_limit_bytes" not in seen  # the server has no limit


def test_pinned_limits_by_index_and_uuid_and_on_no_gpu(site, sleepers) -> None:
    d = site.start_daemon()
    cfg = site.config()
    d.query("set_default_device_pinned_mem_limit 0 4G")
    d.query(f"set_default_device_pinned_mem_limit {UUID} 2G")
    d.query("set_default_device_pinned_mem_limit GPU-00000000-0000-0000-0000-000000000000 8G")
    # Kept per ID, as the real daemon does: each reads back what was set through it.
    assert d.query("get_default_device_pinned_mem_limit 0").stdout == "4G\n"
    assert d.query(f"get_default_device_pinned_mem_limit {UUID}").stdout == "2G\n"
    # Judged only against the device table of a daemon with a server: idle, nothing.
    assert problems(check(cfg)) == []
    d.query(f"fake_client_connect {client(sleepers)} 0")
    found = problems(check(cfg))
    assert [c for c, _m in found] == ["pinned-limit-ambiguous", "pinned-limit-unknown-device"]
    assert f"by index (0 4G) and by UUID ({UUID} 2G)" in found[0][1]
    assert "GPU-00000000-0000-0000-0000-000000000000 8G" in found[1][1]


def test_a_user_who_makes_the_daemon_log_settings_gets_a_warning_at_most(site, sleepers
                                                                         ) -> None:
    """Any local user may send the daemon commands through the 0666 control socket, and
    the daemon logs each one, taken or not: what they make it log is at most a WARNING
    (never a drain, hostile text escaped)."""
    from hostile import ATTACKER, as_user
    from mpsdaemon import control_argv, mps_env

    d = site.start_daemon()
    cfg = site.config()
    d.query(f"fake_client_connect {client(sleepers)} 0")
    for command in ("set_default_device_pinned_mem_limit \x1b[2Jevil 1G",
                    "set_default_device_pinned_mem_limit 0 1G",
                    f"set_default_device_pinned_mem_limit {UUID} 2G"):
        r = subprocess.run(control_argv(site.control), input=command + "\n",
                           env=mps_env(d.pipe_dir), capture_output=True, text=True,
                           timeout=10, **as_user(ATTACKER))
        assert r.returncode == 0, r.stderr
    r = mps_health("check", "--config", cfg, "--only", "limits", "--format", "json")
    data = json.loads(r.stdout)
    assert r.returncode == 1 and {p["state"] for p in data["problems"]} == {"WARNING"}
    # The fake takes any user's setting (whether the real daemon does is not known), so
    # the running server no longer has the default either.
    assert sorted(p["code"] for p in data["problems"]) == \
        ["limits-not-in-force", "pinned-limit-ambiguous", "pinned-limit-unknown-device"]
    assert "\x1b" not in r.stdout and "\\\\x1b[2Jevil" in r.stdout
    from mps_health.healthcheck.slurmnode import by_any_user
    from mps_health.model.results import WARNING, Result

    assert all(by_any_user(Result("limits", WARNING, p["code"], "mps", p["message"]))
               for p in data["problems"])
