"""The run's options reach every command an action quotes, and every problem its runbook
entry (mps_health.model.actionhints), once for every output."""

import shlex

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from mps_health.cli import main as argv
from mps_health.cli.common import UsageError
from mps_health.config.load import DEFAULT_PATH
from mps_health.engine import run as engine
from mps_health.exporters import nagios, text
from mps_health.model import actionhints
from mps_health.model.actionhints import commands, quote, run_options, with_options
from mps_health.model.results import CRITICAL, OK, WARNING, CheckRun, Report, Result

RESET = "run 'mps-health remediate reset gpu0' (dry run first: --dry-run)"
TRICKY = ["/etc/mps health/site.yaml", "/etc/it's.yaml", '/etc/a"b.yaml', "/etc/$HOME.yaml",
          "/etc/a'b c'd.yaml", "/etc/x;rm -rf ~.yaml", "/etc/é.yaml", "/etc/`id`.yaml",
          "/etc/a\\b.yaml", "/etc/'.yaml", "/etc/''.yaml"]


def pasted(action: str) -> list:
    """Each command an action quotes, as the argv an operator's paste gives."""
    return [shlex.split(c) for c in commands(action)]


def test_the_default_config_and_root_add_nothing() -> None:
    assert run_options(None, "/") == ()
    assert run_options(DEFAULT_PATH, "/") == ()
    assert run_options("/etc/mps-health/../mps-health/config.yaml", "/") == ()
    assert with_options(RESET, run_options(DEFAULT_PATH)) == RESET


def test_options_are_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_options("site.yaml", "tree") == (("--config", f"{tmp_path}/site.yaml"),
                                                ("--root", f"{tmp_path}/tree"))


def test_a_quoted_command_gets_the_options_its_subcommand_takes() -> None:
    opts = (("--config", "/etc/site.yaml"), ("--root", "/srv/tree"))
    assert with_options(RESET, opts) == ("run 'mps-health remediate reset gpu0 --config "
                                         "/etc/site.yaml --root /srv/tree' (dry run first: "
                                         "--dry-run)")
    two = "run 'mps-health check -v' as root, then 'mps-health unit stop'"
    assert pasted(with_options(two, opts)) == [
        ["mps-health", "check", "-v", "--config", "/etc/site.yaml", "--root", "/srv/tree"],
        ["mps-health", "unit", "stop", "--config", "/etc/site.yaml"]]  # unit has no --root
    # explain reads no config; a command naming the option already keeps its own
    assert with_options("'mps-health explain x'", opts) == "'mps-health explain x'"
    own = "'mps-health check --config /other.yaml'"
    assert pasted(with_options(own, opts)) == [
        ["mps-health", "check", "--config", "/other.yaml", "--root", "/srv/tree"]]
    # prose that names mps-health is no command
    prose = "another mps-health run holds the lock; run mps-health as root"
    assert with_options(prose, opts) == prose


@pytest.mark.parametrize("path", TRICKY)
def test_a_file_name_is_quoted_for_a_shell_and_pastes_back(path: str) -> None:
    assert quote(path) == shlex.quote(path)
    action = with_options(RESET + "; then 'mps-health check'", (("--config", path),))
    assert pasted(action) == [["mps-health", "remediate", "reset", "gpu0", "--config", path],
                              ["mps-health", "check", "--config", path]]
    assert action.endswith("(dry run first: --dry-run); then 'mps-health check --config "
                           f"{shlex.quote(path)}'")


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1))
def test_any_printable_file_name_pastes_back(name: str) -> None:
    path = "/" + name
    assume(path.isprintable())  # the rest is escaped (the next test)
    assert quote(path) == shlex.quote(path)
    assert pasted(with_options(RESET, (("--config", path),))) == [
        ["mps-health", "remediate", "reset", "gpu0", "--config", path]]


def test_a_control_character_in_a_file_name_is_escaped() -> None:
    action = with_options(RESET, (("--config", "/etc/a\nCRITICAL \x1b[2J.yaml"),))
    assert action.isprintable() and "\\x0a" in action and "\\x1b" in action


def test_the_table_matches_what_each_subcommand_accepts() -> None:
    """TAKES says which run options each subcommand (and each of its actions) parses:
    argparse must accept exactly those."""
    from mps_health.cli.remediate import ACTIONS

    subs = {"remediate": list(ACTIONS), "unit": ["prepare", "stop"], "config": ["example"],
            "slurm": ["gres-conf"], "ack": ["server-churn"]}
    for name in argv.COMMANDS:
        for action in subs.get(name, [""]):
            words = [name, *([action] if action else [])]
            if name == "snapshot":
                words += ["-o", "-"]
            for opt, value in (("--config", "/c.yaml"), ("--root", "/")):
                takes = opt in actionhints.TAKES.get(name, ())
                try:
                    argv.build([*words, opt, value]).parse_args([*words, opt, value])
                    accepted = True
                except UsageError:
                    accepted = False
                if name in ("explain", "slurm", "config") and not takes:
                    continue  # not advised by any check: carries nothing, whatever it takes
                assert accepted == takes, (words, opt)


def _report(*results: Result, check: str = "daemon") -> Report:
    return Report("n1", 0.0, 0.1, (CheckRun(check, results, 0.0),), {}, "0")


def test_every_problem_ends_with_its_runbook_entry_and_ok_says_nothing() -> None:
    runs = actionhints.applied(_report(
        Result("daemon", CRITICAL, "daemon-stale", "gpu0", "gone", RESET),
        Result("daemon", WARNING, "daemon-foreign", "gpu0", "odd"),
        Result("daemon", OK, "ok", "gpu0", "fine")).runs, (("--config", "/etc/s.yaml"),))
    stale, foreign, fine = runs[0].results
    assert stale.action == ("run 'mps-health remediate reset gpu0 --config /etc/s.yaml' (dry "
                            "run first: --dry-run) (runbook: mps-health explain daemon-stale)")
    assert foreign.action == "runbook: mps-health explain daemon-foreign"
    assert fine.action == ""
    line = text.problem_line(stale)
    assert line.endswith("-> run 'mps-health remediate reset gpu0 --config /etc/s.yaml' (dry "
                         "run first: --dry-run) (runbook: mps-health explain daemon-stale)")


def test_a_site_checks_codes_get_no_runbook_entry_but_the_engines_do() -> None:
    from mps_health.model import registry

    registry.checks()  # the built-ins first, as a run has them
    registry.check("site-probe", "site_x:check", ())
    try:
        site = actionhints.applied(_report(
            Result("site-probe", WARNING, "gpu-hot", "", "hot", "cool it"),
            Result("site-probe", CRITICAL, "check-failed", "", "bug", "report it"),
            check="site-probe").runs, (), engine.CODES)
    finally:
        del registry._CHECKS["site-probe"]
    hot, failed = site[0].results
    assert hot.action == "cool it"
    assert failed.action == "report it (runbook: mps-health explain check-failed)"


def test_check_mps_says_the_cut_with_the_runs_options() -> None:
    lines = [f"CRITICAL daemon-stale gpu{i}: " + "x" * 200 for i in range(60)]
    out = nagios.fit("\n".join(["MPS CRITICAL - 60 problems", *lines]),
                     (("--config", "/etc/s.yaml"),))
    assert len(out.encode()) <= nagios.MAX_OUTPUT + 1
    assert out.rstrip("\n").endswith("(run 'mps-health check -v --config /etc/s.yaml')")
