"""mps-health healthcheck end to end against a slurmctld that freezes: a healthy node asks
it nothing; a drain or resume whose scontrol hangs returns within slurm.timeout_s as
UNKNOWN healthcheck-slurm-failed, never drains, and the owed resume happens once scontrol
answers again. A booting node (a --root tree's /proc/uptime) whose dirs are not made yet
is INITIALIZING, never drained; past healthcheck.boot_grace_s the same dirs drain."""

import time
from pathlib import Path

from clirun import mps_health
from nodesite import Site
from remhelp import remediating

IDLE = "NodeName=n1 State=IDLE Partitions=gpu"
DRAINED = "NodeName=n1 State=IDLE+DRAIN Partitions=gpu Reason=MPS-HC: daemon-absent x [root@t]"


def stateful_scontrol(where: Path) -> str:
    """scontrol for node n1: records every call (``calls``) and update (``updates``),
    drains and resumes the node it shows (``node``), and hangs while ``hang`` exists."""
    (where / "node").write_text(IDLE + "\n")
    script = where / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> {where}/calls\n"
        f"if [ -e {where}/hang ]; then exec sleep 60; fi\n"
        f"if [ \"$1\" = show ]; then cat {where}/node; exit 0; fi\n"
        f"echo \"$*\" >> {where}/updates\n"
        "case \"$*\" in\n"
        f"  *State=DRAIN*) echo '{DRAINED}' > {where}/node;;\n"
        f"  *State=RESUME*) echo '{IDLE}' > {where}/node;;\n"
        "esac\n")
    script.chmod(0o755)
    return str(script)


def lines_of(where: Path, name: str) -> list:
    path = where / name
    return path.read_text().splitlines() if path.exists() else []


def healthcheck(cfg: str, *extra: str):
    t0 = time.monotonic()
    r = mps_health("healthcheck", "--foreground", "--config", cfg, *extra)
    return r, time.monotonic() - t0


def prime_state(state_dir: Path) -> None:
    """A known state: a run without one reads the node once to relearn it (by design)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "healthcheck.state").write_text("fails=0\npasses=0\ndrained=no\n")


def test_a_frozen_slurmctld_never_drains_never_hangs_and_the_resume_comes(site: Site) -> None:
    where = site.root
    scontrol = stateful_scontrol(where)
    site.dirs()
    daemon = site.start_daemon()
    # No slurm: section (it would turn on the Slurm checks, which read the node every
    # run): slurm.timeout_s is its default, 5 s.
    # strays disabled: other tests' fake daemons on this machine are impostors to it.
    cfg = site.config(remediating(site), node_name="n1", commands={"scontrol": scontrol},
                      checks={"disable": ["strays"]},
                      healthcheck={"fail_runs": 1, "pass_runs": 1, "boot_grace_s": 0})
    prime_state(site.state_dir)

    # Healthy: slurmctld is asked nothing, run after run.
    for _ in range(2):
        r, _ = healthcheck(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "node not drained by us; healthy" in r.stdout.splitlines()[-1], r.stdout
    assert lines_of(where, "calls") == []

    # A fault while slurmctld is frozen: bounded, UNKNOWN line, no drain.
    daemon.stop()
    (where / "hang").write_text("")
    r, took = healthcheck(cfg)
    assert took < 12.0, took  # one read of 5 s, given up on; never the 60 s it would hang
    assert r.returncode == 2, r.stdout + r.stderr  # the node's own fault, as it is
    assert "MPS UNKNOWN - healthcheck-slurm-failed: the drain was not done" in r.stdout
    assert "drain failed, will retry next run" in r.stdout.splitlines()[-1]
    assert lines_of(where, "updates") == []
    (where / "hang").unlink()
    r, _ = healthcheck(cfg)
    assert "drained (" in r.stdout.splitlines()[-1], r.stdout
    assert [u.split(" Reason=")[0] for u in lines_of(where, "updates")] == [
        "update NodeName=n1 State=DRAIN"]

    # Healthy again while slurmctld is frozen: the resume is owed, not lost.
    daemon.start()
    (where / "hang").write_text("")
    r, took = healthcheck(cfg)
    assert took < 12.0, took
    # UNKNOWN, or WARNING where the restart itself is reported (daemon-restarted).
    assert r.returncode in (1, 3), r.stdout + r.stderr
    assert "MPS UNKNOWN - healthcheck-slurm-failed: the resume was not done" in r.stdout
    assert "drained=yes" in (site.state_dir / "healthcheck.state").read_text()
    (where / "hang").unlink()
    r, _ = healthcheck(cfg)
    assert r.returncode in (0, 1) and "resumed (" in r.stdout.splitlines()[-1], r.stdout
    assert lines_of(where, "updates")[-1] == "update NodeName=n1 State=RESUME"
    assert "drained=no" in (site.state_dir / "healthcheck.state").read_text()


def test_a_booting_node_is_initializing_not_drained(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "proc").mkdir(parents=True)
    (tree / "proc" / "uptime").write_text("30.00 2.00\n")
    prime_state(tree / "state")
    scontrol = stateful_scontrol(tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "node_name: n1\nstate_dir: /state\nrun_dir: /run\n"
        "mps:\n  pipe_dir: /pipe\n  log_dir: /log\n"
        "checks:\n  only: [directories]\n"
        f"commands:\n  scontrol: {scontrol}\n"
        "slurm:\n  timeout_s: 1\n"
        "healthcheck:\n  fail_runs: 1\n  boot_grace_s: 120\n"
        f"remediation:\n  audit_log: {tmp_path}/audit.log\n  syslog: false\n")
    r, _ = healthcheck(str(cfg), "--root", str(tree))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MPS-HC: INITIALIZING - booted 30s ago (healthcheck.boot_grace_s 120): still " \
        "starting, never drained: log-dir-missing node, pipe-dir-missing node" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("MPS-HC: starting;"), r.stdout
    assert lines_of(tmp_path, "calls") == []

    (tree / "proc" / "uptime").write_text("121.00 2.00\n")  # past the grace
    r, _ = healthcheck(str(cfg), "--root", str(tree))
    assert r.returncode == 2 and "INITIALIZING" not in r.stdout, r.stdout
    assert "drained (" in r.stdout.splitlines()[-1], r.stdout


def test_check_nagios_and_metrics_say_starting_while_booting(tmp_path: Path) -> None:
    """The same grace in every output: check (text and JSON), check_mps, the exporter."""
    import json

    from clirun import check_mps

    tree = tmp_path / "tree"
    (tree / "proc").mkdir(parents=True)
    (tree / "proc" / "uptime").write_text("30.00 2.00\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text("state_dir: /state\nrun_dir: /run\nmps:\n  pipe_dir: /pipe\n"
                   "  log_dir: /log\nchecks:\n  only: [directories]\n")
    args = ("--root", str(tree), "--config", str(cfg))
    r = mps_health("check", *args, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["problems"] == [], r.stdout
    assert sorted(x["code"] for x in doc["starting"]) == ["log-dir-missing", "pipe-dir-missing"]
    assert {x["state"] for x in doc["starting"]} == {"starting"}
    text = mps_health("check", *args)
    assert text.returncode == 0 and "INITIALIZING directories[node] pipe-dir-missing: " \
        in text.stdout, text.stdout
    for verbose in ((), ("-v",)):  # said without -v too, as the README promises
        nagios = check_mps(*args, *verbose)
        assert nagios.returncode == 0 and "\nINITIALIZING directories[node] pipe-dir-missing" \
            in nagios.stdout, nagios.stdout
    out = tmp_path / "textfile"
    out.mkdir()
    r = mps_health("exporter", "--textfile", str(out), *args)
    assert r.returncode == 0, r.stderr
    prom = (out / "mps_health.prom").read_text()
    assert 'mps_health_starting{check="directories",code="pipe-dir-missing"' in prom, prom
    assert "mps_health_problems{" not in prom

    (tree / "proc" / "uptime").write_text("301.00 2.00\n")  # past the default grace
    late = mps_health("check", *args, "--format", "json")
    assert late.returncode == 2 and "starting" not in json.loads(late.stdout), late.stdout
