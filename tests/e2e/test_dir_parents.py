"""A parent of a pipe or log dir that other users cannot traverse: the pipe dir looks
right, yet every non-root client fails. The directories check names the parent
(pipe-dir-parent CRITICAL, log-dir-parent WARNING); ``remediate dirs`` never changes it
(mps-health did not make it) and says which chmod to run. On private trees."""

import json
import os
import stat
from pathlib import Path

from clirun import mps_health
from hostile import run_as
from remhelp import remediating


def findings(cfg: str) -> dict:
    r = mps_health("check", "--config", cfg, "--only", "directories", "--format", "json")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    return {p["code"]: p for p in json.loads(r.stdout)["problems"] if p["instance"] == "node"}


def closed_tree(site) -> tuple:
    """site/closed (root's, 0700) holding a right pipe dir (0777) and log dir (0755)."""
    closed = site.root / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    pipe, log = closed / "pipe", closed / "log"
    for d, m in ((pipe, 0o777), (log, 0o755)):
        d.mkdir()
        d.chmod(m)
    return closed, pipe, log


def test_a_root_only_parent_is_named_and_a_job_user_cannot_reach_the_pipe_dir(site) -> None:
    closed, pipe, log = closed_tree(site)
    cfg = site.config(remediating(site), pipe=pipe, log=log)
    # What every client of another user meets: the pipe dir cannot be reached.
    r = run_as("mpshevil", ["ls", str(pipe)])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    found = findings(cfg)
    assert set(found) == {"pipe-dir-parent", "log-dir-parent"}, found
    p = found["pipe-dir-parent"]
    assert p["state"] == "CRITICAL" and f"its parent {closed} has mode 0700" in p["message"]
    assert f"chmod o+x {closed}" in p["action"]
    assert found["log-dir-parent"]["state"] == "WARNING"
    # remediate dirs: nothing changed, the chmod named, exit 1 (refused), audited.
    before = stat.S_IMODE(os.lstat(closed).st_mode)
    d = mps_health("remediate", "dirs", "--config", cfg)
    assert d.returncode == 1, d.stdout + d.stderr
    assert f"its parent {closed} (mode 0700, uid 0) is not traversable" in d.stdout
    assert f"run 'chmod o+x {closed}'" in d.stdout
    assert stat.S_IMODE(os.lstat(closed).st_mode) == before
    audit = (site.root / "audit.log").read_text()
    assert "event=refused result=parent" in audit
    # Opened by hand: the check is clean and a job user reaches the dir.
    closed.chmod(0o711)
    assert findings(cfg) == {}
    assert run_as("mpshevil", ["ls", str(pipe)]).returncode == 0


def test_a_parent_behind_roots_link_is_judged_a_users_link_is_not_followed(site) -> None:
    closed, _, _ = closed_tree(site)
    closed.chmod(0o755)
    # Root's link among the parents (like /var/run -> /run): clients go through it.
    link = site.root / "via"
    link.symlink_to(closed)
    cfg = site.config(remediating(site), pipe=link / "pipe", log=link / "log")
    assert findings(cfg) == {}
    closed.chmod(0o750)
    found = findings(cfg)
    assert set(found) == {"pipe-dir-parent", "log-dir-parent"}, found
    assert f"its parent {link} has mode 0750" in found["pipe-dir-parent"]["message"]
    # A user's link is never followed: no finding from what it points at.
    uid = int(run_as("mpshevil", ["id", "-u"]).stdout)
    os.lchown(link, uid, uid)
    assert "pipe-dir-parent" not in findings(cfg)


def test_the_walk_is_bounded(site) -> None:
    from mps_health.config.load import load
    from mps_health.probes.context import Context
    from mps_health.probes.dirs import MAX_PARENTS, blocked_parents

    deep = Path(site.root)
    for _ in range(MAX_PARENTS + 10):
        deep = deep / "d"
    ctx = Context(load(site.config(remediating(site)), table=None), "/")
    assert blocked_parents(ctx, str(deep)) == ()  # missing: the walk stops, no error
    deep.mkdir(parents=True)
    (site.root / "d").chmod(0o700)
    [found] = blocked_parents(ctx, str(deep))
    assert found.path == str(site.root / "d") and found.mode == 0o700
    deep.parent.chmod(0o700)  # beyond MAX_PARENTS components: not looked at
    assert len(blocked_parents(ctx, str(deep))) == 1
