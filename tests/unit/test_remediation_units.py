"""The pure parts of remediation, on real captured Slurm output and real processes."""
# ruff: noqa: F811  (the fixture test_user comes from remhelp)

import os
import shutil
import subprocess
import time

import pytest
from conftest import FAKE_SERVER, fixture_text
from hypothesis import given
from hypothesis import strategies as st
from mps_health.config import remediation as settings
from mps_health.config.load import ConfigError, from_mapping
from mps_health.config.slurm import settings as slurm_settings
from mps_health.healthcheck import detach, slurmnode
from mps_health.healthcheck import state as hcstate
from mps_health.hostio import safedirs
from mps_health.model.facts import Instance
from mps_health.probes.proc import read_process
from mps_health.probes.slurm import SlurmNode, parse_node_line
from mps_health.remediation import dirs
from mps_health.remediation import processes as procs
from mps_health.remediation.orphans import orphans_of
from mps_health.remediation.tmpfiles_guard import guarded_paths, render
from mpsdaemon import start_daemon
from paths import fake_binaries
from remhelp import alive, make_dirs, test_user  # noqa: F401

TAG = "MPS-HC:"


def node(name: str) -> SlurmNode:
    return parse_node_line(fixture_text(f"scontrol_show_node_-o__slurm-22.05_{name}.txt"))


# --- scontrol show node -o (Slurm 22.05, captured from the test cluster) --------------
def test_parse_idle_node() -> None:
    v = node("idle")
    assert (v.name, v.state, v.flags, v.reason) == ("mpsnode", "IDLE", ("IDLE",), "")


def test_parse_our_drain_strips_slurms_user_and_time() -> None:
    v = node("drained-mps-hc")
    assert v.state == "IDLE+DRAIN"
    assert v.reason == "MPS-HC: control-wedged node: the control daemon did not answer"
    assert v.reason_is(TAG)
    assert not v.reason_is("NHC:")


def test_parse_reason_with_spaces_and_commas() -> None:
    v = node("drained-by-admin-not-responding")
    assert v.reason == "disk replaced, ticket 123"
    assert v.flags == ("IDLE", "DRAIN", "NOT_RESPONDING")


@pytest.mark.parametrize("name, drain, resume", [
    ("idle", True, False),
    ("drained-mps-hc", False, True),
    ("mixed-drain-mps-hc", False, True),
    ("drained-by-admin-not-responding", False, False),  # someone else's reason
    ("down", False, False),
    ("reboot-requested", False, False),
])
def test_tag_rules_on_real_states(name: str, drain: bool, resume: bool) -> None:
    v = node(name)
    assert slurmnode.may_drain(v, TAG)[0] is drain, slurmnode.may_drain(v, TAG)
    assert slurmnode.may_resume(v, TAG)[0] is resume, slurmnode.may_resume(v, TAG)


def test_why_a_drain_is_refused_is_said() -> None:
    assert slurmnode.may_drain(node("down"), TAG) == \
        (False, "node is DOWN: left to Slurm and the admins")
    assert slurmnode.may_drain(node("drained-by-admin-not-responding"), TAG) == \
        (False, "already drained by someone else (disk replaced, ticket 123): left alone")
    assert slurmnode.may_drain(node("drained-mps-hc"), TAG) == (False, "already drained by us")
    human = SlurmNode("n", "IDLE+DRAIN", ("IDLE", "DRAIN"), "disk replaced", (), None)
    assert slurmnode.may_drain(human, TAG) == \
        (False, "already drained by someone else (disk replaced): left alone")
    assert slurmnode.may_resume(human, TAG) == \
        (False, "drained by someone else (disk replaced): left alone")


def test_no_such_node_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a node record: 'Node nosuch not found'"):
        parse_node_line(
            fixture_text("scontrol_show_node_-o__slurm-22.05_no-such-node.txt"))


@given(st.text())
def test_any_text_parses_or_fails_clearly(text: str) -> None:
    try:
        v = parse_node_line(text)
    except ValueError as e:
        assert str(e)
    else:
        assert isinstance(v.state, str) and isinstance(v.reason, str)


def test_reason_text_is_one_bounded_line() -> None:
    r = slurmnode.reason_text(TAG, "control-wedged gpu0:", "a\nlong " + "x" * 300)
    assert r.startswith("MPS-HC: control-wedged gpu0: a long x")
    assert len(r) == 120 and "\n" not in r and r.endswith("...")


def test_orphans_are_instances_whose_job_slurm_does_not_list() -> None:
    insts = (Instance("job1", "per-job", "/tmp/a1", "/tmp/l1", job_id="1"),
             Instance("job2", "per-job", "/tmp/a2", "/tmp/l2", job_id="2"))
    assert orphans_of(insts, {"1"}) == (insts[1],)
    assert orphans_of(insts, {"1", "2"}) == ()


# --- anti-flap -------------------------------------------------------------------------
def run_sequence(verdicts, fail_runs=2, pass_runs=2, env=None, recheck=600.0):
    state, actions = hcstate.HcState(), []
    for v in verdicts:
        state = hcstate.count(state, v, "code")
        need = hcstate.decide(state, v, fail_runs, pass_runs, recheck, env, 1000.0)
        actions.append(need.action)
        if need.action == "drain":
            state = state._replace(drained=True, verified_at=1000.0)
        elif need.action in ("resume", "forget"):
            state = state._replace(drained=False)
    return actions


def test_one_failed_run_does_not_drain_two_do() -> None:
    assert run_sequence(["fail"]) == ["none"]
    assert run_sequence(["fail", "fail", "fail"]) == ["none", "drain", "none"]
    assert run_sequence(["fail", "pass", "fail"]) == ["none", "none", "none"]


def test_resume_needs_clean_runs_in_a_row() -> None:
    assert run_sequence(["fail", "fail", "pass", "fail", "fail", "pass", "pass"]) == \
        ["none", "drain", "none", "none", "none", "none", "resume"]


def test_unknown_runs_neither_drain_nor_resume_nor_reset_the_count() -> None:
    assert run_sequence(["fail", "unknown", "fail"]) == ["none", "none", "drain"]


def test_slurm_node_is_healthy_saves_calls() -> None:
    # Slurm says the node is out of service: no drain call for a failing run.
    assert run_sequence(["fail", "fail"], env=False) == ["none", "none"]
    # Slurm says it is in service though we drained it: someone resumed it by hand.
    state = hcstate.HcState(passes=0, drained=True)
    state = hcstate.count(state, "pass")
    assert hcstate.decide(state, "pass", 2, 2, 600, True, 0).action == "forget"


def test_drained_and_still_failing_rechecks_the_node_now_and_then() -> None:
    state = hcstate.HcState(fails=5, drained=True, verified_at=1000.0)
    assert hcstate.decide(state, "fail", 2, 2, 600, None, 1100.0).action == "none"
    assert hcstate.decide(state, "fail", 2, 2, 600, None, 1700.0).action == "drain"


def test_verdicts() -> None:
    assert [hcstate.verdict_of(s, "critical") for s in (0, 1, 2, 3)] == \
        ["pass", "pass", "fail", "unknown"]
    assert hcstate.verdict_of(1, "warning") == "fail"


def test_state_file_round_trip_and_garbage() -> None:
    s = hcstate.HcState(3, 0, True, "control-wedged", 1234.0)
    assert hcstate.parse(hcstate.dumps(s)) == s
    assert hcstate.parse("fails=lots\n") == hcstate.HcState(known=False)
    assert hcstate.node_healthy_from_env(None) is None
    assert hcstate.node_healthy_from_env("yes") is True


# --- detached results ------------------------------------------------------------------
def test_results_expire_and_do_not_survive_a_reboot() -> None:
    r = detach.parse_result(detach.format_result(2, "boot-a", 100.0, "MPS CRITICAL - x\nline"))
    assert r == detach.StoredResult(2, "boot-a", 100.0, "MPS CRITICAL - x\nline")
    assert detach.current(r, "boot-a", 150.0, 900) == r
    assert detach.current(r, "boot-b", 150.0, 900) is None
    assert detach.current(r, "boot-a", 1100.0, 900) is None
    assert detach.parse_result("garbage") is None


# --- settings ------------------------------------------------------------------------------
def settings_error(section: str, body: dict) -> str:
    with pytest.raises(ConfigError) as e:
        from_mapping({section: body}, "/etc/mps-health/config.yaml")
    return str(e.value)


def test_settings_errors_are_one_line() -> None:
    assert settings_error("slurm", {"drain_tag": "NHC:"}) == (
        "/etc/mps-health/config.yaml: key 'slurm.drain_tag': must not start with NHC: LBNL NHC "
        "would resume our drains")
    assert "healthcheck.fail_runs': must be a whole number from 1 to 100 (got 0)" in \
        settings_error("healthcheck", {"fail_runs": 0})
    assert "key 'remediation.kill': unknown key" in settings_error("remediation", {"kill": 1})
    assert "at least 3 x slurm.timeout_s + 2 = 17 (got 8)" in \
        settings_error("healthcheck", {"timeout_s": 8})
    cfg = from_mapping({}, None)
    defaults = settings.healthcheck(cfg)
    assert (slurm_settings(cfg).drain_tag, defaults.fail_runs, defaults.pass_runs) == \
        ("MPS-HC:", 2, 2)
    assert defaults.timeout_s < settings.SLURMD_KILL_S


# --- dirs and the no-follow walk ---------------------------------------------------------
T = dirs.DirTarget("/tmp/x", 0o777, 0, 0, frozenset({0}), clear=True)


def test_dir_actions() -> None:
    assert dirs.actions("missing", 0, -1, T) == ("create",)
    assert dirs.actions("symlink", 0o777, 0, T) == ("move-aside", "create")
    assert dirs.actions("dir", 0o777, 1000, T) == ("move-aside", "create")
    assert dirs.actions("dir", 0o700, 0, T) == ("clear", "chmod")
    assert dirs.actions("file", 0o644, 0, T) == ("move-aside", "create")


def test_open_dir_refuses_a_users_symlink_in_a_shared_dir(site, test_user) -> None:
    shared = site.root / "shared"
    make_dirs(shared, site.root / "real" / "sub", mode=0o755)
    shared.chmod(0o1777)
    (shared / "link").symlink_to(site.root / "real")
    os.lchown(shared / "link", test_user.pw_uid, test_user.pw_gid)
    with pytest.raises(safedirs.UnsafePath, match="a symlink owned by uid"):
        safedirs.open_dir(f"{shared}/link/sub")
    os.lchown(shared / "link", 0, 0)  # root's own link there is followed (like /var/run)
    fd = safedirs.open_dir(f"{shared}/link/sub")
    os.close(fd)
    with pytest.raises(safedirs.UnsafePath, match=r"'\.\.'"):
        safedirs.open_dir(f"{site.root}/real/../real")
    (site.root / "real").chmod(0o777)  # anyone could swap what is inside: not walked through
    with pytest.raises(safedirs.UnsafePath, match="writable by others without the sticky bit"):
        safedirs.open_dir(f"{site.root}/real/sub")


def test_remove_tree_unlinks_symlinks_without_entering_them(site) -> None:
    make_dirs(site.root / "victim", site.root / "gone" / "deep")
    (site.root / "victim" / "keep").write_text("k")
    (site.root / "gone" / "deep" / "link").symlink_to(site.root / "victim")
    (site.root / "gone" / "file").write_text("f")
    fd = safedirs.open_dir(str(site.root))
    try:
        assert safedirs.remove_tree(fd, "gone", f"{site.root}/gone") == []
    finally:
        os.close(fd)
    assert not (site.root / "gone").exists()
    assert (site.root / "victim" / "keep").read_text() == "k"


# --- verified PIDs ---------------------------------------------------------------------------
def test_a_pid_reused_by_another_process_is_left_alone(site) -> None:
    site.dirs()
    pid = start_daemon(site.pipe, site.log)
    fact = read_process("/proc", pid, fake_binaries())
    assert fact is not None
    reused = fact._replace(start_ticks=fact.start_ticks + 1)  # "the same PID, another start"
    assert procs.end_all("/proc", [reused], 1.0)[0].outcome == "replaced"
    other_user = fact._replace(uid=fact.uid + 1)  # "the same PID, another owner"
    assert procs.end_all("/proc", [other_user], 1.0)[0].outcome == "replaced"
    assert alive(pid)
    assert procs.end_all("/proc", [fact], 1.0)[0].outcome == "terminated"
    assert not alive(pid)


def test_servers_that_ignore_sigterm_are_killed_after_one_grace_time(site) -> None:
    server = FAKE_SERVER
    started = [subprocess.Popen([server], stdout=subprocess.PIPE, text=True,
                                env={"PATH": "/usr/bin:/bin", "FAKE_MPS_IGNORE_TERM": "1",
                                     "CUDA_MPS_PIPE_DIRECTORY": str(site.root)})
               for _ in range(3)]
    try:
        for s in started:
            assert s.stdout is not None and s.stdout.readline() == "ready\n"
        facts = [read_process("/proc", s.pid, fake_binaries()) for s in started]
        assert all(f is not None and f.role == "server" for f in facts)
        ended = procs.end_all("/proc", [f for f in facts if f is not None], 0.5)
        assert [e.outcome for e in ended] == ["killed"] * 3
        assert all(s.wait(5) == -9 for s in started)
    finally:
        for s in started:
            s.kill()
            s.wait()


def test_the_processes_of_an_instance() -> None:
    from mps_health.model.facts import ProcessFact

    inst = Instance("gpu0", "per-gpu", "/tmp/mps_0", "/var/log/mps_0", gpu="0")

    def p(pid, ppid, role, pipe, state="S"):
        return ProcessFact(pid, ppid, state, 0, role, (f"nvidia-cuda-mps-{role}",), pid, pipe,
                           True)

    found = (p(10, 1, "control", "/tmp/mps_0"), p(11, 10, "server", "/tmp/nvidia-mps"),
             p(12, 1, "server", "/tmp/mps_0"), p(20, 1, "control", "/tmp/mps_1"),
             p(21, 20, "server", "/tmp/mps_1"), p(30, 1, "control", "/tmp/mps_0", "Z"))
    daemons, servers = procs.of_instance(inst, found)
    assert [d.pid for d in daemons] == [10]
    assert [s.pid for s in servers] == [11, 12]
    # A user's stopped server binary on the pipe dir, not the daemon's child, is no
    # server of the instance (its clients never hold back a reset); the daemon's own
    # stopped server still is.
    theirs = p(13, 1, "server", "/tmp/mps_0", "T")._replace(uid=1001)
    own = p(14, 10, "server", "/tmp/mps_0", "T")._replace(uid=1001)
    _, servers = procs.of_instance(inst, (*found, theirs, own))
    assert [s.pid for s in servers] == [11, 12, 14]


def test_a_non_mps_process_is_never_signalled() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        fake = read_process("/proc", os.getpid())  # we are not an MPS process: None
        assert fake is None
        from mps_health.model.facts import ProcessFact

        fact = ProcessFact(sleeper.pid, 1, "S", 0, "control", ("nvidia-cuda-mps-control",),
                           0, "/tmp/nvidia-mps", True)
        # Not proven to run the MPS binary: refused before /proc is even read again.
        assert procs.end_all("/proc", [fact], 0.5)[0].outcome == "refused"
        # Claimed proven: /proc shows no MPS process under that PID.
        assert procs.end_all("/proc", [fact._replace(genuine=True)], 0.5)[0].outcome == "gone"
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


# --- tmpfiles guard ----------------------------------------------------------------------
def test_guard_covers_every_layout() -> None:
    node = from_mapping({}, None).mps
    assert guarded_paths(node) == ["/tmp/nvidia-mps", "/var/log/nvidia-mps"]
    gpu = from_mapping({"mps": {"layout": "per-gpu", "gpus": [0, 3]}}, None).mps
    assert guarded_paths(gpu) == ["/tmp/nvidia-mps_0", "/var/log/nvidia-mps_0",
                                  "/tmp/nvidia-mps_3", "/var/log/nvidia-mps_3"]
    job = from_mapping({"mps": {"layout": "per-job", "pipe_dir": "/tmp/mps_{job}_{gpu}",
                                "log_dir": "/tmp/mps-log_{job}_{gpu}"}}, None).mps
    assert guarded_paths(job) == ["/tmp/mps_*_*", "/tmp/mps-log_*_*"]
    assert render(node).splitlines()[-2:] == ["x /tmp/nvidia-mps", "x /var/log/nvidia-mps"]


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None,
                    reason="systemd-tmpfiles not installed (apt-get install systemd)")
def test_real_systemd_tmpfiles_spares_what_the_guard_covers(site) -> None:
    """systemd-tmpfiles --clean, with /tmp aged after 1 s, under a private --root."""
    root = site.root / "root"
    make_dirs(root / "etc" / "tmpfiles.d", root / "usr" / "lib" / "tmpfiles.d",
              root / "tmp" / "nvidia-mps_job7", root / "tmp" / "unguarded", mode=0o755)
    (root / "usr/lib/tmpfiles.d/tmp.conf").write_text("d /tmp 1777 root root 1s\n")
    cfg = from_mapping({"mps": {"layout": "per-job"}}, None)
    (root / "etc/tmpfiles.d/mps-health.conf").write_text(render(cfg.mps))
    (root / "tmp/nvidia-mps_job7/control_lock").write_text("")
    (root / "tmp/unguarded/old").write_text("")
    time.sleep(2.2)
    r = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--clean"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (root / "tmp/nvidia-mps_job7/control_lock").exists()
    assert not (root / "tmp/unguarded/old").exists()  # the aging rule really ran
