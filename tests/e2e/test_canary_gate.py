"""canary.when: idle (the default): the canary runs only where Slurm says the node is
IDLE and no MPS client is connected, and is killed when a job step starts while it runs.
Fake daemon, fake canary, and a fake scontrol printing a captured IDLE node line (its
State changed for the other cases)."""

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from clirun import mps_health, results
from conftest import FAKES

# The idle gate watches the whole node for a new root slurmstepd (a job step arriving):
# in its own PID namespace a test sees only its own, never another run's or another
# engineer's Slurm (tests/helpers/privatepids.py).
pytestmark = pytest.mark.private_pids

IDLE = (Path(__file__).resolve().parent.parent / "fixtures"
        / "scontrol_show_node_-d_-o__slurm-22.05_idle.txt").read_text()


def scontrol(site, state: str = "IDLE") -> str:
    """A scontrol stand-in answering 'show node NAME -o' with this node in ``state``."""
    out = site.root / f"node-{state}.txt"
    out.write_text(IDLE.replace("State=IDLE", f"State={state}"))
    script = site.root / f"scontrol-{state}"
    script.write_text(f"#!/bin/sh\nexec cat {out}\n")
    script.chmod(0o755)
    return str(script)


def config(site, scontrol_path: str, extra: str = "") -> str:
    return site.config(f"node_name: mpsnode\ncommands:\n  mps-health-canary: "
                       f"{FAKES / 'mps-canary'}\n  scontrol: {scontrol_path}\n{extra}")


def canary(cfg: str) -> dict:
    r = mps_health("check", "--config", cfg, "--only", "canary", "--format", "json")
    assert r.returncode in (0, 2, 3), r.stdout + r.stderr
    (res,) = results(r, "canary")
    return res


def connects(site) -> int:
    log = site.log / "control.log"
    return log.read_text().count("fake_client_connect") if log.exists() else 0


def test_idle_node_runs_the_canary(site) -> None:
    site.start_daemon()
    res = canary(config(site, scontrol(site)))
    assert res["code"] == "ok", res
    assert "got a context in" in res["message"]
    # Drained and idle (a repair being checked): no job to delay, it runs.
    assert canary(config(site, scontrol(site, "IDLE+DRAIN")))["code"] == "ok"


def test_allocated_or_mixed_node_skips_it_without_starting_it(site) -> None:
    site.start_daemon()
    for state in ("ALLOCATED", "MIXED", "IDLE+COMPLETING"):
        res = canary(config(site, scontrol(site, state)))
        assert res["code"] == "canary-skipped", res
        assert f"Slurm says node mpsnode is {state}, not IDLE" in res["message"]
    assert connects(site) == 0  # never ran


def test_a_node_slurm_does_not_manage_skips_it_and_always_runs_it(site) -> None:
    site.start_daemon()
    missing = str(site.root / "no-such-scontrol")
    res = canary(config(site, missing))
    assert res["code"] == "canary-skipped"
    assert "this node is not managed by Slurm" in res["message"]
    assert "canary.when: always runs it anyway" in res["message"]
    res = canary(config(site, missing, "canary:\n  when: always\n"))
    assert res["code"] == "ok", res
    never = canary(config(site, scontrol(site), "canary:\n  when: never\n"))
    assert never["code"] == "canary-skipped" and "canary.when is never" in never["message"]


def test_an_idle_node_with_an_mps_client_skips_it(site) -> None:
    d = site.start_daemon()
    client = subprocess.Popen(["sleep", "120"])  # our own uid: 'always' would run beside it
    try:
        server = d.query(f"fake_client_connect {client.pid} {os.getuid()}").stdout.strip()
        res = canary(config(site, scontrol(site)))
        assert res["code"] == "canary-skipped", res
        assert f"1 MPS client(s) connected (e.g. {client.pid}, uid {os.getuid()}, on " \
               f"server {server}): the node is not idle" in res["message"]
        assert connects(site) == 1  # only the client's
    finally:
        client.kill()
        client.wait()


def test_a_job_step_starting_while_it_runs_kills_it_at_once(site) -> None:
    d = site.start_daemon()
    cfg = config(site, scontrol(site),
                 "canary:\n  timeout_s: 20\n  poll_s: 0.05\ncontrol:\n  timeout_s: 0.5\n")
    stepd = site.root / "slurmstepd"  # comm "slurmstepd", root's: a job step's process
    shutil.copy("/bin/sleep", stepd)
    d.signal(signal.SIGSTOP)  # the canary hangs in its connect, as behind a busy server
    started = []

    def job_arrives() -> None:
        # Once the canary runs (hung in its connect): a job step arriving before it
        # started is one the idle gate would have seen, not this case.
        deadline = time.monotonic() + 15
        while not _canaries(str(site.pipe)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        started.append(subprocess.Popen([str(stepd), "60"]))

    t = threading.Thread(target=job_arrives)
    t0 = time.monotonic()
    t.start()
    try:
        res = canary(cfg)
    finally:
        d.signal(signal.SIGCONT)
        t.join()
        for p in started:
            p.kill()
            p.wait()
    spent = time.monotonic() - t0
    assert res["code"] == "canary-skipped", res
    assert "stopped: a job step started on this node while it ran (slurmstepd " \
        in res["message"]
    assert spent < 15, spent  # killed at once, not at canary.timeout_s (20 s)
    assert not _canaries(str(site.pipe))


def _canaries(pipe: str) -> list:
    """The fake canaries running on ``pipe`` (by their environment)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if b"mps-canary" in Path(f"/proc/{name}/cmdline").read_bytes() and \
                    pipe.encode() in Path(f"/proc/{name}/environ").read_bytes():
                found.append(int(name))
        except OSError:
            continue
    return found


def checks_run(cfg: str) -> dict:
    """Each check that ran -> its results (``mps-health check``, the default selection)."""
    import json

    # Skipped: the host's rules (tmpfiles), the whole node (strays, where other tests'
    # daemons run) and the host's Slurm config (the other checks a slurm: section adds).
    r = mps_health("check", "--config", cfg, "--format", "json", "--skip",
                   "tmpfiles,strays,gres-drift,orphans,clients")
    return {c["name"]: c["results"] for c in json.loads(r.stdout)["checks"]}


def test_on_by_default_only_where_slurm_manages_the_node(site) -> None:
    site.start_daemon()
    idle = scontrol(site)
    # "canary: {}": the canary's section alone (defaults, when: idle) turns nothing on;
    # it also keeps tests/helpers/nodesite.py from turning the canary off for this test.
    no_slurm = config(site, idle, "canary: {}\n")
    assert "canary" not in checks_run(no_slurm)
    assert connects(site) == 0
    # A slurm: section (the node is Slurm's): on, idle-gated; this node is IDLE, so it ran.
    on = checks_run(config(site, idle, "canary: {}\nslurm: {}\n"))
    assert [r["code"] for r in on["canary"]] == ["ok"], on["canary"]
    assert connects(site) == 1
    # A job on the node: not run (OK, skipped).
    busy = checks_run(config(site, scontrol(site, "MIXED"), "canary: {}\nslurm: {}\n"))
    assert [r["code"] for r in busy["canary"]] == ["canary-skipped"], busy["canary"]
    # Turned off by the site: checks.disable, or canary.when: never.
    off = checks_run(config(site, idle, "canary: {}\nslurm: {}\nchecks:\n  disable: [canary]\n"))
    assert "canary" not in off
    never = checks_run(config(site, idle, "canary:\n  when: never\nslurm: {}\n"))
    assert [r["code"] for r in never["canary"]] == ["canary-skipped"]
    assert connects(site) == 1  # none of those ran it


def test_no_new_finding_where_no_daemon_runs_or_mps_is_not_installed(site) -> None:
    """The canary on by default finds nothing of its own where there is no daemon (it
    follows from daemon-absent) or no MPS binary (from mps-not-installed; with no
    driver there is no libcuda either: the real canary client on this machine)."""
    site.dirs()
    cfg = config(site, scontrol(site), "canary: {}\nslurm: {}\n")
    found = checks_run(cfg)
    counted = [(c, r["code"]) for c, rs in found.items() for r in rs
               if r["state"] != "OK" and not r.get("cause")]
    canary_results = found["canary"]
    print(counted, canary_results)
    assert [r.get("cause") for r in canary_results] == ["daemon-absent"], canary_results
    assert not [c for c, _code in counted if c == "canary"]
    # No MPS binaries, and the real canary client (no libcuda on this machine).
    bare = site.config(f"node_name: mpsnode\ncommands:\n  scontrol: {scontrol(site)}\n"
                       f"  nvidia-cuda-mps-control: {site.root}/none\n"
                       "canary: {}\nslurm: {}\n")
    found = checks_run(bare)
    (res,) = found["canary"]
    assert res["code"] in ("canary-no-libcuda", "canary-not-served"), res
    assert res.get("cause") == "mps-not-installed", res
    counted = [r["code"] for rs in found.values() for r in rs
               if r["state"] != "OK" and not r.get("cause")]
    assert counted == ["mps-not-installed"], counted


def counting_scontrol(site) -> tuple:
    """A scontrol stand-in that logs each call (one line of its arguments) and answers
    'show node' (with or without -d) with this IDLE node."""
    out = site.root / "node-idle.txt"
    out.write_text(IDLE)
    log = site.root / "scontrol.log"
    script = site.root / "scontrol-counting"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                      f"exec cat {out}\n")
    script.chmod(0o755)
    return str(script), log


def calls_of(log: Path) -> list:
    """The calls logged since the last look (the log starts afresh)."""
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def test_a_warm_run_reads_the_node_once_for_the_gate_and_the_slurm_source(site) -> None:
    """The canary's idle gate takes the slurm source's answer: one slurmctld call a run."""
    site.start_daemon()
    path, log = counting_scontrol(site)
    cfg = config(site, path, "canary: {}\nslurm: {}\n")
    both = ("check", "--config", cfg, "--format", "json", "--only", "canary,orphans")
    first = mps_health(*both)
    assert [r["code"] for r in results(first, "canary")] == ["ok"], first.stdout
    assert calls_of(log) == ["-d show node mpsnode -o"]
    warm = mps_health(*both)
    assert [r["code"] for r in results(warm, "canary")] == ["ok"], warm.stdout
    assert calls_of(log) == ["-d show node mpsnode -o"]
    # The slurm source not selected: the gate reads the node itself, once.
    assert canary(cfg)["code"] == "ok"
    assert calls_of(log) == ["show node mpsnode -o"]
    # A node that is not idle, in the shared answer: the gate still keeps the canary out.
    (site.root / "node-idle.txt").write_text(IDLE.replace("State=IDLE", "State=MIXED"))
    busy = mps_health(*both)
    (res,) = results(busy, "canary")
    assert res["code"] == "canary-skipped" and "is MIXED, not IDLE" in res["message"], res
    assert calls_of(log) == ["-d show node mpsnode -o"]
