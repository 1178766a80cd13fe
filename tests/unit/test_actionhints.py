"""Every command an action advises is carried as its argv, given the run's options and
quoted as shlex.join writes it; every problem gets its runbook entry
(mps_health.engine.actionhints), once for every output."""

import shlex

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from mps_health.cli import main as argv
from mps_health.cli.common import UsageError
from mps_health.config.load import DEFAULT_PATH
from mps_health.engine import actionhints
from mps_health.engine import run as engine
from mps_health.engine.actionhints import RESET, Advice, advice, quoted, run_options, with_options
from mps_health.exporters import nagios, text
from mps_health.model.results import CRITICAL, OK, WARNING, CheckRun, Report, Result
from pasted import commands

GPU0 = (*RESET, "gpu0")
RESET_GPU0 = advice("run ", GPU0, " (dry run first: --dry-run)")
TRICKY = ["/etc/mps health/site.yaml", "/etc/it's.yaml", '/etc/a"b.yaml', "/etc/$HOME.yaml",
          "/etc/a'b c'd.yaml", "/etc/x;rm -rf ~.yaml", "/etc/é.yaml", "/etc/`id`.yaml",
          "/etc/a\\b.yaml", "/etc/'.yaml", "/etc/''.yaml"]


def pasted(action: str) -> list:
    """Each command an action quotes, as the argv an operator's paste gives."""
    return [shlex.split(c) for c in commands(action)]


def test_an_advice_quotes_each_command_and_keeps_its_argv() -> None:
    assert Advice("run 'mps-health remediate reset gpu0' (dry run first: "
                                "--dry-run)", (GPU0,)) == RESET_GPU0
    then = advice("if it persists, ", RESET_GPU0, "; then ", ("mps-health", "check"))
    assert then.commands == (GPU0, ("mps-health", "check"))
    assert then.text.endswith("; then 'mps-health check'")


def test_the_default_config_and_root_add_nothing() -> None:
    assert run_options(None, "/") == ()
    assert run_options(DEFAULT_PATH, "/") == ()
    assert run_options("/etc/mps-health/../mps-health/config.yaml", "/") == ()
    assert with_options(RESET_GPU0, run_options(DEFAULT_PATH)) == RESET_GPU0


def test_options_are_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_options("site.yaml", "tree") == (("--config", f"{tmp_path}/site.yaml"),
                                                ("--root", f"{tmp_path}/tree"))


def test_a_command_gets_the_options_its_subcommand_takes() -> None:
    opts = (("--config", "/etc/site.yaml"), ("--root", "/srv/tree"))
    assert with_options(RESET_GPU0, opts) == Advice(
        "run 'mps-health remediate reset gpu0 --config /etc/site.yaml --root /srv/tree' (dry "
        "run first: --dry-run)", ((*GPU0, "--config", "/etc/site.yaml", "--root", "/srv/tree"),))
    two = advice("run ", ("mps-health", "check", "-v"), " as root, then ",
                 ("mps-health", "unit", "stop"))
    assert with_options(two, opts).commands == (
        ("mps-health", "check", "-v", "--config", "/etc/site.yaml", "--root", "/srv/tree"),
        ("mps-health", "unit", "stop", "--config", "/etc/site.yaml"))  # unit has no --root
    assert pasted(with_options(two, opts).text) == list(map(list, with_options(two, opts).commands))
    # explain reads no config; a command naming the option already keeps its own
    explain = advice(("mps-health", "explain", "x"))
    assert with_options(explain, opts) == explain
    own = advice(("mps-health", "check", "--config", "/other.yaml"))
    assert pasted(with_options(own, opts).text) == [
        ["mps-health", "check", "--config", "/other.yaml", "--root", "/srv/tree"]]
    # the same command twice: each place quotes it with the options
    twice = with_options(advice(GPU0, " or ", GPU0), opts)
    assert twice.text.count("--root /srv/tree") == 2 and len(set(twice.commands)) == 1
    # prose that names mps-health is no command: nothing changes
    prose = Advice("another mps-health run holds the lock; run mps-health as root")
    assert with_options(prose, opts) == prose


@pytest.mark.parametrize("path", TRICKY)
def test_a_file_name_is_quoted_for_a_shell_and_pastes_back(path: str) -> None:
    action = with_options(advice(RESET_GPU0, "; then ", ("mps-health", "check")),
                          (("--config", path),))
    assert action.commands == ((*GPU0, "--config", path), ("mps-health", "check", "--config", path))
    assert pasted(action.text) == list(map(list, action.commands))
    assert action.text.endswith("(dry run first: --dry-run); then 'mps-health check --config "
                                f"{shlex.quote(path)}'")


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1))
def test_any_printable_file_name_pastes_back(name: str) -> None:
    path = "/" + name
    assume(path.isprintable())  # the rest is escaped (the next test)
    assert pasted(with_options(RESET_GPU0, (("--config", path),)).text) == [
        ["mps-health", "remediate", "reset", "gpu0", "--config", path]]


def test_a_control_character_in_a_file_name_is_escaped() -> None:
    path = "/etc/a\nCRITICAL \x1b[2J.yaml"
    action = with_options(RESET_GPU0, (("--config", path),))
    assert action.text.isprintable() and "\\x0a" in action.text and "\\x1b" in action.text
    assert action.commands == ((*GPU0, "--config", path),)  # the argv itself is whole
    assert quoted(action.commands[0]) in action.text


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
        Result("daemon", CRITICAL, "daemon-stale", "gpu0", "gone", RESET_GPU0.text,
               commands=RESET_GPU0.commands),
        Result("daemon", WARNING, "daemon-foreign", "gpu0", "odd"),
        Result("daemon", OK, "ok", "gpu0", "fine")).runs, (("--config", "/etc/s.yaml"),))
    stale, foreign, fine = runs[0].results
    assert stale.action == ("run 'mps-health remediate reset gpu0 --config /etc/s.yaml' (dry "
                            "run first: --dry-run) (runbook: mps-health explain daemon-stale)")
    assert stale.commands == ((*GPU0, "--config", "/etc/s.yaml"),)
    assert foreign.action == "runbook: mps-health explain daemon-foreign"
    assert fine.action == ""
    line = text.problem_line(stale)
    assert line.endswith("-> run 'mps-health remediate reset gpu0 --config /etc/s.yaml' (dry "
                         "run first: --dry-run) (runbook: mps-health explain daemon-stale)")


def test_a_site_checks_codes_get_no_runbook_entry_but_the_engines_do() -> None:
    from mps_health.engine import registry

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
