"""``remediate tmpfiles-guard``: keep systemd-tmpfiles away from every configured instance.

Writes /etc/tmpfiles.d/mps-health.conf (under --root): one ``x PATH`` line (no cleaning of
the path and all in it) per pipe and log dir, per-job templates as globs (``{job}``,
``{gpu}`` -> ``*``) so future jobs are covered. A file of that name not ours is left
alone unless --force. The dry run shows a unified diff; the write is atomic and checked
by reading the merged configuration back.

systemd-tmpfiles applies the guard at every boot as root, so nothing else may get into
it: the text is parsed back before writing and must be exactly one ``x`` rule per path,
and a guard that fails the check after writing is undone (old file back, or removed).
"""

import difflib
import os
from typing import List, Optional

from mps_health.checks.tmpfiles import guarded
from mps_health.config.load import Config, MpsConfig
from mps_health.config.remediation import remediation
from mps_health.config.templates import expand, glob
from mps_health.hostio.safedirs import open_dir, split
from mps_health.hostio.safefiles import read_small, write_atomic
from mps_health.probes.context import Context
from mps_health.probes.tmpfiles import gather, parse_tmpfiles
from mps_health.remediation.actions import (
    DONE,
    FAILED,
    REFUSED,
    Say,
    audit_for,
    lock_node,
    need_root,
)

GUARD_FILE = "/etc/tmpfiles.d/mps-health.conf"
HEADER = ("# Written by 'mps-health remediate tmpfiles-guard': systemd-tmpfiles must not clean\n"
          "# the MPS pipe and log dirs. Edits here are overwritten; change the mps-health\n"
          "# config instead.\n")


def guarded_paths(mps: MpsConfig) -> List[str]:
    """The pipe and log dirs of every configured instance, per-job ones as globs."""
    if mps.layout == "node":
        found = [mps.pipe_dir, mps.log_dir]
    elif mps.layout == "per-gpu":
        found = [expand(p, gpu=g) for g in mps.gpus for p in (mps.pipe_dir, mps.log_dir)]
    else:
        found = [glob(p) for p in (mps.pipe_dir, mps.log_dir)]
    return list(dict.fromkeys(found))


def _quote(path: str) -> str:
    if any(c.isspace() or c in "\"'\\" for c in path):
        return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return path


def render(mps: MpsConfig) -> str:
    return HEADER + "".join(f"x {_quote(p)}\n" for p in guarded_paths(mps))


def rendered_rules_ok(text: str, mps: MpsConfig) -> bool:
    """``text`` holds nothing but one ``x`` rule per guarded path, in order."""
    rules, errors = parse_tmpfiles(text, GUARD_FILE)
    return not errors and [(r.type, r.path) for r in rules] == \
        [("x", p) for p in guarded_paths(mps)]


def _put_back(old: Optional[str], root: str) -> str:
    """Undo our write: the previous content again, or no file; what was done."""
    try:
        if old is None:
            parent, name = split(GUARD_FILE)
            fd = open_dir(parent, root)
            try:
                os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)
            return "the new file was removed again"
        write_atomic(GUARD_FILE, old.encode(), 0o644, root=root)
        return "the previous file was put back"
    except OSError as e:
        return f"and it could not be undone ({e.strerror}): remove {GUARD_FILE} by hand"


def diff(old: Optional[str], new: str) -> str:
    before = (old or "").splitlines(keepends=True)
    lines = difflib.unified_diff(before, new.splitlines(keepends=True),
                                 fromfile=GUARD_FILE if old is not None else "/dev/null",
                                 tofile=GUARD_FILE)
    return "".join(lines).rstrip("\n")


def verify(ctx: Context) -> List[str]:
    """Instances the merged tmpfiles.d configuration still does not guard."""
    facts = gather(ctx)
    mps = ctx.config.mps
    samples = [p.format(job="1", gpu="0") for p in (mps.pipe_dir, mps.log_dir)] \
        if mps.layout == "per-job" else guarded_paths(mps)
    return [p for p in samples if not guarded(facts.rules, p)]


def run(config: Config, root: str, force: bool, dry_run: bool, say: Say) -> int:
    settings = remediation(config)
    ctx = Context(config, root)
    new = render(config.mps)
    try:
        raw = read_small(ctx.path(GUARD_FILE))
    except OSError as e:
        say(f"tmpfiles-guard: cannot read {GUARD_FILE}: {e.strerror}")
        return FAILED
    old = raw.decode("utf-8", "replace") if raw is not None else None
    if not rendered_rules_ok(new, config.mps):
        say(f"tmpfiles-guard: FAILED: the guard for these paths would not be plain 'x' rules; "
            f"nothing was written: {', '.join(guarded_paths(config.mps))}")
        return FAILED
    if old == new:
        say(f"tmpfiles-guard: {GUARD_FILE} is up to date")
        return DONE
    if old is not None and not old.startswith(HEADER.splitlines()[0]) and not force:
        say(f"tmpfiles-guard: refused: {GUARD_FILE} exists and was not written by mps-health; "
            "merge these lines by hand or use --force to replace it:")
        say(diff(old, new))
        return REFUSED
    say(f"tmpfiles-guard: {'create' if old is None else 'update'} {GUARD_FILE}:")
    say(diff(old, new))
    if dry_run:
        say("dry run: nothing was changed")
        return DONE
    need_root(dry_run, "tmpfiles-guard")
    audit = audit_for(ctx, settings, "tmpfiles-guard")
    with lock_node(ctx, settings, "tmpfiles-guard"):
        try:
            parent = ctx.path(os.path.dirname(GUARD_FILE))
            if not os.path.isdir(parent) and os.path.isdir(os.path.dirname(parent)):
                os.mkdir(parent, 0o755)
            write_atomic(GUARD_FILE, new.encode(), 0o644, root=root)
        except OSError as e:
            say(f"FAILED: cannot write {GUARD_FILE}: {e.strerror}")
            audit.record("write", "failed", file=GUARD_FILE, detail=str(e.strerror))
            return FAILED
        missing = verify(ctx)
        if missing:  # undone under the same lock
            undone = _put_back(old, root)
            say(f"FAILED: written, but still not guarded: {', '.join(missing)} (another "
                "tmpfiles.d file may override it; see 'systemd-tmpfiles --cat-config'); "
                + undone)
            audit.record("write", "failed", file=GUARD_FILE, detail="not guarded: " +
                         ", ".join(missing) + "; " + undone)
            return FAILED
    paths = guarded_paths(config.mps)
    say(f"written; every instance is excluded from cleaning ({len(paths)} paths)")
    audit.record("write", "ok", file=GUARD_FILE, paths=" ".join(paths))
    return DONE
