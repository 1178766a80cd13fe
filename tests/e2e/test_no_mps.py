"""A node without MPS: the cause first, in one line; a reset refuses and changes nothing."""
# ruff: noqa: F811  (the fixture tree comes from remhelp)

from pathlib import Path

from clirun import mps_health
from remhelp import tree, write_config  # noqa: F401


def no_mps_config(tree: Path) -> str:
    cfg = write_config(tree)
    text = Path(cfg).read_text()
    text = "\n".join(ln for ln in text.splitlines() if "nvidia-cuda-mps-control:" not in ln)
    text = text.replace("commands:\n", f"commands:\n  nvidia-cuda-mps-control: {tree}/none\n")
    Path(cfg).write_text(text)
    return cfg


def test_check_leads_with_the_missing_binary(tree: Path) -> None:
    cfg = no_mps_config(tree)
    r = mps_health("check", "--config", cfg, "--only", "daemon,control")
    assert r.returncode == 2, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("MPS CRITICAL - 2 problems: mps-not-installed node"), first
    assert "daemon-absent" not in r.stdout and "remediate reset" not in r.stdout
    assert f"MPS is not installed on this node ({tree}/none: command not found)" in r.stdout


def test_reset_refuses_up_front_and_makes_nothing(tree: Path) -> None:
    cfg = no_mps_config(tree)
    for extra in ((), ("--dry-run",)):
        r = mps_health("remediate", "reset", "--config", cfg, *extra)
        assert r.returncode == 3, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "is not installed" in r.stderr, r.stderr
    assert not (tree / "pipe").exists() and not (tree / "log").exists()


def test_a_daemon_that_fails_to_start_is_quoted_and_had_a_fixed_path(tree: Path) -> None:
    fake = tree / "bad-control"
    fake.write_text("#!/bin/sh\necho \"[x] PATH=$PATH; cannot open /dev/nvidiactl\" >> "
                    "\"$CUDA_MPS_LOG_DIRECTORY/control.log\"\necho 'driver not loaded' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    cfg = no_mps_config(tree)
    Path(cfg).write_text(Path(cfg).read_text().replace(f"{tree}/none", str(fake)))
    r = mps_health("remediate", "reset", "--config", cfg,
                   env={"PATH": f"{tree}/evil:/usr/bin:/bin"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "(the launcher exited 1: 'driver not loaded')" in r.stdout, r.stdout
    assert "control.log ends: [x] PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:" \
        "/sbin:/bin; cannot open /dev/nvidiactl" in r.stdout, r.stdout
