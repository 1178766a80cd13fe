"""tmpfiles: systemd-tmpfiles will not delete the pipe dirs while MPS idles.

A pipe dir is at risk when an age-limited rule (d, D, e, v, q, Q with an age) covers
one of its parents: after the age passes with no new client, the sockets are removed
and the next job fails to reach MPS. It is guarded by an ``x`` rule matching the dir
or a parent (the dir and its contents), or by ``X`` on the dir plus ``x`` on its
contents. Globs match one path component at a time, as systemd's FNM_PATHNAME does.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Callable, Iterator, Optional, Tuple

from mps_health.config.load import Config
from mps_health.engine import registry
from mps_health.engine.actionhints import quoted
from mps_health.model.facts import Facts, TmpfilesFacts, TmpfilesRule
from mps_health.model.results import OK, WARNING, Result, ok

NAME = "tmpfiles"
CODES = ("tmpfiles-unguarded",)

registry.check(NAME, f"{__name__}:check", ("tmpfiles",), order=50,
               summary="systemd-tmpfiles will not clean the pipe dirs")

AGING_TYPES = frozenset("dDevqQ")
GUARD = ("mps-health", "remediate", "tmpfiles-guard")


def _literal(pattern: str) -> bool:
    return not any(c in pattern for c in "*?[")


def _ancestors_and_self(path: str) -> Tuple[str, ...]:
    parts = path.rstrip("/").split("/")
    return tuple("/".join(parts[:i]) or "/" for i in range(2, len(parts) + 1))


def _matcher(paths: Tuple[str, ...]) -> Callable[[str], bool]:
    """Does a rule's pattern match one of ``paths``? A rule without a wildcard (most of
    them) is one set lookup; a glob is matched per component (FNM_PATHNAME: '*' never
    crosses a '/')."""
    plain = frozenset(p.rstrip("/") for p in paths)
    split = [p.rstrip("/").split("/") for p in paths]

    def match(pattern: str) -> bool:
        if _literal(pattern):
            return pattern.rstrip("/") in plain
        parts = pattern.rstrip("/").split("/")
        return any(len(parts) == len(s) and all(map(fnmatchcase, s, parts)) for s in split)
    return match


def aging_rule(rules: Tuple[TmpfilesRule, ...], path: str) -> Optional[TmpfilesRule]:
    """The rule that would age ``path`` (a rule with an age on one of its parents)."""
    parents = _matcher(_ancestors_and_self(path)[:-1] or ("/",))
    return next((r for r in rules if r.type in AGING_TYPES and r.age not in ("-", "", "0")
                 and parents(r.path)), None)


def guarded(rules: Tuple[TmpfilesRule, ...], path: str) -> bool:
    lower_x = [r.path for r in rules if r.type == "x"]
    if any(map(_matcher(_ancestors_and_self(path)), lower_x)):
        return True  # the dir or a parent, with everything under it
    contents = any(map(_matcher((path + "/control",)), lower_x))
    itself = any(map(_matcher((path,)), [r.path for r in rules if r.type == "X"]))
    return contents and itself


def check(facts: Facts, config: Config) -> Iterator[Result]:
    tf: TmpfilesFacts = facts.get("tmpfiles")
    if not tf.available:
        yield Result(NAME, OK, "ok", "", "no tmpfiles.d directories: systemd-tmpfiles "
                     "does not clean this node")
        return
    paths = [(i.name, i.pipe_dir) for i in facts.instances]
    if config.mps.layout == "per-job":
        # Judge the template itself: a job started tomorrow must be guarded too.
        sample = config.mps.pipe_dir.format(job="1", gpu="0")
        paths = [("per-job", sample), *paths]
    for name, path in paths:
        rule = aging_rule(tf.rules, path)
        if guarded(tf.rules, path):
            yield ok(NAME, name, f"{path} is excluded from systemd-tmpfiles cleaning", guarded=1.0)
        elif rule is not None or config.tmpfiles.require_guard:
            why = (f"{rule.file}:{rule.line} ages {rule.path} after {rule.age}" if rule
                   else "the config requires a guard")
            yield Result(NAME, WARNING, "tmpfiles-unguarded", name,
                         f"{path} is not excluded from systemd-tmpfiles cleaning ({why}): "
                         "idle MPS sockets will be deleted",
                         f"run {quoted(GUARD)}", (("guarded", 0.0),), commands=(GUARD,))
        else:  # what could not be read (a planted FIFO, a bad line) might still age it
            more = f" (+{len(tf.errors) - 1} more)" if len(tf.errors) > 1 else ""
            unread = f", as far as could be read: {tf.errors[0]}{more}" if tf.errors else ""
            yield ok(NAME, name, f"{path} is not under an aged path{unread}", guarded=0.0)
