"""The health check's circuit breaker and observe-only checks, on made Slurm answers."""

from pathlib import Path
from typing import Sequence

import pytest
from hostile import public_dir  # noqa: F401
from mps_health.config.load import ConfigError, from_mapping
from mps_health.engine import registry
from mps_health.healthcheck import run as healthcheck
from mps_health.healthcheck import slurmnode
from mps_health.model.results import CRITICAL, OK, WARNING, CheckRun, Report, Result
from mps_health.probes.slurm import SlurmNode, parse_node_lines

TAG = "MPS-HC:"


def nodes(spec: str) -> Sequence[SlurmNode]:
    """'a:gpu:ours b:gpu:idle c:cpu:ours' -> scontrol show node -o lines, parsed."""
    lines = []
    for word in spec.split():
        name, part, how = word.split(":")
        state, reason = {"ours": ("IDLE+DRAIN", f"{TAG} control-absent node: x [root@t]"),
                         "admin": ("IDLE+DRAIN", "disk swap [root@t]"),
                         "idle": ("IDLE", "")}[how]
        lines.append(f"NodeName={name} Arch=x86_64 State={state} Partitions={part} "
                     + (f"Reason={reason}" if reason else ""))
    return parse_node_lines("\n".join(lines))


def test_partitions_are_parsed() -> None:
    (n,) = parse_node_lines("NodeName=a State=IDLE Partitions=gpu,debug Reason=x [u@t]")
    assert n.partitions == ("gpu", "debug") and n.reason == "x"


@pytest.mark.parametrize("spec, share, count, held", [
    ("me:gpu:idle b:gpu:idle c:gpu:ours d:gpu:idle", 0.5, None, False),  # 1 of 4
    ("me:gpu:idle b:gpu:ours c:gpu:ours d:gpu:idle", 0.5, None, False),  # 2 of 4: not more
    ("me:gpu:idle b:gpu:ours c:gpu:ours d:gpu:ours", 0.5, None, True),  # 3 of 4
    ("me:gpu:idle b:gpu:ours c:gpu:ours d:gpu:idle", 0.25, None, True),
    ("me:gpu:idle b:gpu:ours c:gpu:idle d:gpu:idle", 1.0, 0, True),  # any other: hold
    ("me:gpu:idle b:gpu:ours c:gpu:ours d:gpu:ours", 1.0, None, False),  # no limit
    # other partitions and other people's drains do not count
    ("me:gpu:idle b:cpu:ours c:cpu:ours d:gpu:admin", 0.25, None, False),
])
def test_breaker(spec: str, share: float, count, held: bool) -> None:
    why = slurmnode.fleet_breaker("me", TAG, share, count)(nodes(spec))
    assert bool(why) == held
    if held:
        assert why.startswith("fleet-wide fault suspected: ") and "partition gpu" in why


def config(tmp_path: Path, **extra) -> object:
    return from_mapping({"state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run"),
                         "mps": {"pipe_dir": str(tmp_path / "pipe"),
                                 "log_dir": str(tmp_path / "log")},
                         **extra}, None, registry)


def test_observed_checks_are_reported_but_never_drain(tmp_path: Path) -> None:
    cfg = config(tmp_path, checks={"only": ["directories"], "observe": ["directories"]},
                 healthcheck={"fail_runs": 1}, commands={"scontrol": "/bin/false"})
    r = healthcheck.run_once(cfg, "/", False, {})
    assert r.rc == 2  # still reported as it is
    assert "MPS-HC: observe only, never drains: directories" in r.lines
    assert r.lines[-1].startswith("MPS-HC: pass;"), r.lines


def test_observe_names_known_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"checks\.observe"):
        config(tmp_path, checks={"observe": ["no-such-check"]})


def test_a_held_drain_is_critical_fleet_wide_fault(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        "if [ \"$3\" = n1 ]; then echo 'NodeName=n1 State=IDLE Partitions=gpu'; exit 0; fi\n"
        "if [ \"$1 $2 $3\" = 'show node -o' ]; then\n"
        "  echo 'NodeName=n1 State=IDLE Partitions=gpu'\n"
        f"  echo 'NodeName=n2 State=IDLE+DRAIN Partitions=gpu Reason={TAG} x y: z [root@t]'\n"
        f"  echo 'NodeName=n3 State=IDLE+DRAIN Partitions=gpu Reason={TAG} x y: z [root@t]'\n"
        "  exit 0; fi\n"
        f"echo \"$*\" >> {tmp_path}/updates; exit 0\n")
    scontrol.chmod(0o755)
    cfg = config(tmp_path, checks={"only": ["directories"]}, healthcheck={"fail_runs": 1},
                 commands={"scontrol": str(scontrol)}, node_name="n1",
                 remediation={"audit_log": str(tmp_path / "audit.log"), "syslog": False})
    r = healthcheck.run_once(cfg, "/", False, {})
    assert r.rc == 2
    text = "\n".join(r.lines)
    assert "MPS CRITICAL - fleet-wide-fault: fleet-wide fault suspected: 2 of 3 nodes of " \
        "partition gpu already drained by MPS-HC: (limit 50%)" in text, text
    assert "node not drained by us; not drained: fleet-wide" in r.lines[-1]
    assert not (tmp_path / "updates").exists()  # no scontrol update was made
    assert "event=drain result=held" in (tmp_path / "audit.log").read_text()


@pytest.mark.parametrize("reason, code", [
    (f"{TAG} control-wedged gpu0: the daemon did not answer", "control-wedged"),
    (f"{TAG} orphan-dir: job 7's dirs", "orphan-dir"),
    (f"{TAG}", ""), ("disk swap", ""), ("", ""),
])
def test_reason_code_reads_our_reasons_only(reason: str, code: str) -> None:
    assert slurmnode.reason_code(reason, TAG) == code


def drained_for(code: str, *names: str) -> Sequence[SlurmNode]:
    lines = ["NodeName=me State=IDLE Partitions=gpu"]
    lines += [f"NodeName={n} State=IDLE+DRAIN Partitions=gpu Reason={TAG} {code} gpu0: x [root@t]"
              for n in names]
    return parse_node_lines("\n".join(lines))


@pytest.mark.parametrize("code", sorted(slurmnode.NOT_COUNTED))
def test_drains_a_user_can_cause_do_not_hold_a_real_one(code: str) -> None:
    breaker = slurmnode.fleet_breaker("me", TAG, 0.25, None)
    assert breaker(drained_for(code, "b", "c", "d")) == ""
    assert breaker(drained_for("control-wedged", "b", "c", "d")).startswith("fleet-wide")


def report_with(*found: Result) -> Report:
    return Report("n1", 0.0, 0.0, (CheckRun("strays", tuple(found), 0.0),), {}, "test")


def test_findings_a_user_can_cause_never_make_the_verdict() -> None:
    user = Result("strays", WARNING, "server-unclaimed", "", "held by uid 1001", "look")
    real = Result("strays", CRITICAL, "server-orphaned", "", "server with no daemon", "reset")
    assert healthcheck.drainable(report_with(user), ()).state == OK
    assert healthcheck.drainable(report_with(user, real), ()).state == CRITICAL
    assert healthcheck.drainable(report_with(real), ("strays",)).runs == ()


def test_a_user_caused_warning_never_drains_even_with_drain_on_warning(
        public_dir: Path) -> None:  # noqa: F811
    """A stray in the pipe dir (any user can make one) with drain_on: warning and a
    one-run threshold: reported, the run passes, scontrol is never called. In a 0755 dir:
    pytest's tmp_path base is 0700, which the directories check reports
    (pipe-dir-parent)."""
    tmp_path = public_dir
    pipe = tmp_path / "pipe"
    pipe.mkdir(mode=0o777)
    pipe.chmod(0o777)
    (tmp_path / "log").mkdir()
    (tmp_path / "log").chmod(0o755)
    (pipe / "planted").write_text("x")
    cfg = config(tmp_path, checks={"only": ["directories"]},
                 healthcheck={"fail_runs": 1, "drain_on": "warning"},
                 commands={"scontrol": str(tmp_path / "no-scontrol")})
    r = healthcheck.run_once(cfg, "/", False, {})
    text = "\n".join(r.lines)
    assert r.rc == 1 and "pipe-entry-foreign" in text, text
    assert "MPS-HC: a local user can cause these, so they never drain: pipe-entry-foreign" \
        in r.lines, text
    assert r.lines[-1].startswith("MPS-HC: pass;"), r.lines


def test_a_per_job_server_no_daemon_vouches_for_never_drains() -> None:
    held = Result("orphans", WARNING, "orphan-server", "job7", "held by its user", "look")
    real = held._replace(state=CRITICAL)
    assert healthcheck.drainable(report_with(held), ()).state == OK
    assert healthcheck.drainable(report_with(real), ()).state == CRITICAL
