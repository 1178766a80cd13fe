"""Many dirs or many jobs never mean as many root processes: dirs Slurm does not know
start no control client, instances and concurrent clients are capped (configurable),
and no per-pipe-dir lock file stays behind."""

import json
from pathlib import Path
from typing import Any, List, Tuple

from clirun import mps_health
from conftest import FAKE_CONTROL
from hostile import ATTACKER, VICTIM, ensure_user, run_as, squeue_line
from nodesite import Site

SYSTEM_PYTHON = "/usr/bin/python3"


def counting_client(base: Path) -> Tuple[str, Path]:
    """The fake control client, logging its start and end (in order, under flock)."""
    log = base / "clients.log"
    script = base / "counting-control"
    script.write_text(f"""#!/bin/sh
exec 9>>{log}
flock 9; echo "start $$" >&9; flock -u 9
sleep 0.3
flock 9; echo "end $$" >&9; flock -u 9
exec 9>&-
exec {FAKE_CONTROL} "$@"
""")
    script.chmod(0o755)
    return str(script), log


def most_at_once(log: Path) -> Tuple[int, int]:
    """(clients started, most running at the same time) from the client log."""
    lines: List[str] = log.read_text().split() if log.exists() else []
    running = peak = started = 0
    for word in lines[::2]:
        if word == "start":
            started += 1
            running += 1
            peak = max(peak, running)
        else:
            running -= 1
    return started, peak


def per_job(site: Site, jobs: List[str], **sections: Any) -> Tuple[Path, Path, Path]:
    """A per-job config whose control client counts its runs, Slurm running ``jobs``."""
    client, log = counting_client(site.root)
    config = site.config(site.per_job(), sections,
                         commands={"nvidia-cuda-mps-control": client,
                                   "squeue": site.squeue(*jobs)})
    return Path(config), site.sticky_tmp(), log


def check(config: Path) -> Tuple[int, dict]:
    r = mps_health("check", "--config", str(config), "--only", "daemon,control", "--format", "json")
    assert r.returncode in (0, 1, 2, 3) and r.stderr == "", r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def test_three_thousand_strangers_dirs_start_no_client(site: Site) -> None:
    config, parent, log = per_job(site, [])
    ensure_user(ATTACKER)
    r = run_as(ATTACKER, [SYSTEM_PYTHON, "-c", "import os,sys\nfor i in range(3000): "
                          "os.mkdir(f'{sys.argv[1]}/nvidia-mps_job{4000 + i}', 0o777)",
                          str(parent)], timeout=60)
    assert r.returncode == 0, r.stderr
    rc, report = check(config)
    assert (rc, report["problems"]) == (0, [])
    assert most_at_once(log) == (0, 0)
    assert not list((site.root / "run").glob("*.lock"))


def test_instances_and_concurrent_clients_are_capped(site: Site) -> None:
    pw = ensure_user(VICTIM)
    jobs = [str(j) for j in range(71, 77)]
    config, parent, log = per_job(site, [squeue_line(j, VICTIM) for j in jobs],
                                  mps={"max_instances": 4}, control={"max_clients": 2})
    for j in jobs:  # the victim's six jobs' dirs; their daemons are gone
        r = run_as(VICTIM, ["mkdir", "-m", "0700", str(parent / f"nvidia-mps_job{j}"),
                            str(parent / f"nvidia-log_job{j}")])
        assert r.returncode == 0, r.stderr
    rc, report = check(config)
    found = {(p["instance"], p["code"]): p for p in report["problems"]}
    capped = found[("", "instances-capped")]
    assert capped["state"] == "WARNING" and capped["message"].startswith("2 more per-job")
    # Four daemons asked (their control-absent folded under each one's absent daemon).
    results = [x for c in report["checks"] for x in c["results"]]
    assert {x["instance"] for x in results if x["code"] == "control-absent"} == \
        {f"job{j}" for j in jobs[:4]}
    assert most_at_once(log) == (4, 2)
    assert rc == 1  # the job user's own dirs: at most WARNING
    assert not list((site.root / "run").glob("*.lock"))
    assert pw.pw_uid != 0
