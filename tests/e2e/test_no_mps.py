"""A node without MPS: the cause first, in one line; a reset refuses and changes nothing."""

from pathlib import Path

from clirun import mps_health
from nodesite import Site
from remhelp import remediating


def no_mps_config(site: Site) -> str:
    return site.config(remediating(site),
                       commands={"nvidia-cuda-mps-control": f"{site.root}/none"})


def test_check_leads_with_the_missing_binary(site) -> None:
    cfg = no_mps_config(site)
    r = mps_health("check", "--config", cfg, "--only", "daemon,control")
    assert r.returncode == 2, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("MPS CRITICAL - 2 problems: mps-not-installed node"), first
    assert "daemon-absent" not in r.stdout and "remediate reset" not in r.stdout
    assert f"MPS is not installed on this node ({site.root}/none: command not found)" in r.stdout


def test_reset_refuses_up_front_and_makes_nothing(site) -> None:
    cfg = no_mps_config(site)
    for extra in ((), ("--dry-run",)):
        r = mps_health("remediate", "reset", "--config", cfg, *extra)
        assert r.returncode == 3, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "is not installed" in r.stderr, r.stderr
    assert not site.pipe.exists() and not site.log.exists()


def test_a_daemon_that_fails_to_start_is_quoted_and_had_a_fixed_path(site) -> None:
    fake = site.root / "bad-control"
    fake.write_text("#!/bin/sh\necho \"[x] PATH=$PATH; cannot open /dev/nvidiactl\" >> "
                    "\"$CUDA_MPS_LOG_DIRECTORY/control.log\"\necho 'driver not loaded' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    cfg = no_mps_config(site)
    Path(cfg).write_text(Path(cfg).read_text().replace(f"{site.root}/none", str(fake)))
    r = mps_health("remediate", "reset", "--config", cfg,
                   env={"PATH": f"{site.root}/evil:/usr/bin:/bin"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "(the launcher exited 1: 'driver not loaded')" in r.stdout, r.stdout
    assert "control.log ends: [x] PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:" \
        "/sbin:/bin; cannot open /dev/nvidiactl" in r.stdout, r.stdout
