"""The tmpfiles check on made rules: a pipe dir under an aged path without an ``x``
guard, a guard, no aging, no systemd, and the per-job template judged too.

Reading tmpfiles.d as systemd does is tests/unit/test_tmpfiles.py's."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import pytest
from mps_health.checks import tmpfiles
from mps_health.model.facts import TmpfilesFacts, TmpfilesRule
from mps_health.model.results import OK, WARNING, Result

from .made import JOB, NODE, codes, run

AGED = TmpfilesRule("/usr/lib/tmpfiles.d/tmp.conf", 11, "D", "/tmp", "10d")
GUARD = TmpfilesRule("/etc/tmpfiles.d/mps-health.conf", 1, "x", "/tmp/nvidia-mps*", "-")


def judge(*rules: TmpfilesRule, cfg: Optional[Dict[str, Any]] = None,
          errors: Sequence[str] = (), available: bool = True,
          instances: Sequence[Any] = (NODE,)) -> List[Result]:
    tf = TmpfilesFacts(available, tuple(sorted({r.file for r in rules})), rules, tuple(errors))
    return run(tmpfiles, {"tmpfiles": tf}, instances, cfg)


def test_a_pipe_dir_under_an_aged_path_without_a_guard() -> None:
    (r,) = judge(AGED)
    assert (r.instance, r.state, r.code) == ("node", WARNING, "tmpfiles-unguarded")
    assert r.message == "/tmp/nvidia-mps is not excluded from systemd-tmpfiles cleaning " \
        "(/usr/lib/tmpfiles.d/tmp.conf:11 ages /tmp after 10d): idle MPS sockets will be deleted"
    assert r.action == "run 'mps-health remediate tmpfiles-guard'"
    assert dict(r.values) == {"guarded": 0.0}


def test_a_guarded_pipe_dir_is_ok() -> None:
    (r,) = judge(AGED, GUARD)
    assert (r.state, r.code) == (OK, "ok")
    assert r.message == "/tmp/nvidia-mps is excluded from systemd-tmpfiles cleaning"
    assert dict(r.values) == {"guarded": 1.0}


@pytest.mark.parametrize("rule", [
    TmpfilesRule("/etc/tmpfiles.d/tmp.conf", 1, "D", "/tmp", "-"),  # no age: never cleaned
    TmpfilesRule("/etc/tmpfiles.d/x.conf", 1, "d", "/var/tmp", "30d"),  # another tree
])
def test_no_aging_rule_over_the_pipe_dir_is_ok(rule: TmpfilesRule) -> None:
    (r,) = judge(rule)
    assert (r.state, r.code) == (OK, "ok")
    assert r.message == "/tmp/nvidia-mps is not under an aged path"


def test_the_config_may_require_a_guard_anyway() -> None:
    (r,) = judge(cfg={"tmpfiles": {"require_guard": True}})
    assert (r.state, r.code) == (WARNING, "tmpfiles-unguarded")
    assert "(the config requires a guard)" in r.message


def test_what_could_not_be_read_is_said() -> None:
    (r,) = judge(errors=["/etc/tmpfiles.d/evil.conf: not a regular file", "x:1: bad line"])
    assert r.code == "ok"
    assert r.message.endswith(", as far as could be read: /etc/tmpfiles.d/evil.conf: not a "
                              "regular file (+1 more)")


def test_no_systemd_tmpfiles_is_ok() -> None:
    assert codes(judge(available=False)) == [("", OK, "ok")]


def test_the_per_job_template_is_judged_too() -> None:
    cfg = {"mps": {"layout": "per-job", "pipe_dir": "/tmp/nvidia-mps_job{job}",
                   "log_dir": "/tmp/nvidia-log_job{job}"}}
    found = judge(AGED, cfg=cfg, instances=(JOB,))
    assert codes(found) == [("per-job", WARNING, "tmpfiles-unguarded"),
                            ("job77", WARNING, "tmpfiles-unguarded")]
    assert found[0].message.startswith("/tmp/nvidia-mps_job1 is not excluded")
    assert codes(judge(AGED, GUARD, cfg=cfg, instances=())) == [("per-job", OK, "ok")]
