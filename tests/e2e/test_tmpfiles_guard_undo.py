"""``remediate tmpfiles-guard`` never leaves a guard that failed its check: systemd-tmpfiles
applies it as root at every boot."""

from pathlib import Path

from clirun import mps_health
from hostile import public_dir
from mps_health.config.load import from_mapping
from mps_health.remediation.tmpfiles_guard import GUARD_FILE, render, rendered_rules_ok

__all__ = ["public_dir"]  # the fixture, used by name


def _tree(base: Path, pipe_dir: str) -> Path:
    root = base / "root"
    for d in ("etc/tmpfiles.d", "usr/lib/tmpfiles.d", "run"):
        (root / d).mkdir(parents=True)
    (root / "usr/lib/tmpfiles.d/tmp.conf").write_text("q /tmp 1777 root root 10d\n")
    (base / "config.yaml").write_text(
        f"run_dir: {base}/run\nstate_dir: {base}/state\nmps:\n  pipe_dir: '{pipe_dir}'\n"
        f"remediation:\n  audit_log: {base}/audit.log\n  syslog: false\n")
    return root


def test_a_guard_that_does_not_guard_is_removed_again(public_dir: Path) -> None:
    """'[a]' is a glob to systemd-tmpfiles: 'x /tmp/mps[a]' does not cover /tmp/mps[a]."""
    root = _tree(public_dir, "/tmp/mps[a]")
    r = mps_health("remediate", "tmpfiles-guard", "--root", str(root), "--config",
            str(public_dir / "config.yaml"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "still not guarded: /tmp/mps[a]" in r.stdout + r.stderr
    assert "the new file was removed again" in r.stdout + r.stderr
    assert not (root / GUARD_FILE.lstrip("/")).exists()


def test_a_failed_update_puts_the_previous_guard_back(public_dir: Path) -> None:
    root = _tree(public_dir, "/tmp/mps[a]")
    previous = render(from_mapping({}, None).mps)  # ours, for the default dirs
    (root / GUARD_FILE.lstrip("/")).write_text(previous)
    r = mps_health("remediate", "tmpfiles-guard", "--root", str(root), "--config",
            str(public_dir / "config.yaml"))
    assert r.returncode == 2 and "the previous file was put back" in r.stdout + r.stderr
    assert (root / GUARD_FILE.lstrip("/")).read_text() == previous


def test_only_plain_x_rules_are_ever_rendered() -> None:
    mps = from_mapping({}, None).mps
    assert rendered_rules_ok(render(mps), mps)
    assert not rendered_rules_ok(render(mps) + "R /etc\n", mps)
