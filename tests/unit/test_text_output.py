"""exporters/text.py on made reports: the summary's count is what -v lists, a terminal's
lines fit its width and carry colour only around the state's name; and the commands'
help: every option says what it does, `check --help` the exit codes."""

import argparse
from typing import Iterator, List

import pytest
from mps_health.cli.main import COMMANDS, build
from mps_health.exporters import text
from mps_health.model.results import CRITICAL, OK, CheckRun, Report, Result


def report(*runs: CheckRun) -> Report:
    return Report("n1", 0.0, 0.01, runs, {"dirs": 0.001}, "v")


HEALTHY = report(
    CheckRun("daemon", (Result("daemon", OK, "ok", "node", "daemon 5 serves /p"),), 0.0),
    CheckRun("directories", (Result("directories", OK, "ok", "node", "pipe dir fine"),
                             Result("directories", OK, "ok", "node", "log dir fine")), 0.0),
    CheckRun("servers", (Result("servers", OK, "ok", "", "server history: not saved"),
                         Result("servers", OK, "ok", "node", "no server running")), 0.0))


def test_the_count_passed_is_what_verbose_lists() -> None:
    lines = list(text.lines(HEALTHY, verbose=True))
    listed = [line for line in lines if line.startswith("OK ")]
    assert len(listed) == 5  # three checks, five results
    assert lines[0] == "MPS OK - 5 checks passed on n1 in 0.01s"
    one = report(HEALTHY.runs[0])
    assert text.summary_line(one) == "MPS OK - 1 check passed on n1 in 0.01s"
    # A note (what a user other than root cannot save) is no check passed: NOTE, not OK.
    note = Result("servers", OK, "history-not-saved", "", "server history: not saved")
    noted = report(*HEALTHY.runs, CheckRun("servers", (note,), 0.0))
    assert text.summary_line(noted) == text.summary_line(HEALTHY)
    assert "NOTE servers: server history: not saved" in list(text.lines(noted, verbose=True))


BROKEN = report(CheckRun("daemon", (
    Result("daemon", CRITICAL, "daemon-stale", "node", "no live daemon for /p: " + "x" * 200,
           "run 'mps-health remediate reset node'"),), 0.0),
    CheckRun("directories", (Result("directories", OK, "ok", "node", "fine"),), 0.0))


def test_not_a_terminal_is_every_word() -> None:
    assert list(text.lines(BROKEN)) == [
        "MPS CRITICAL - 1 problem: daemon-stale node",
        "CRITICAL daemon[node] daemon-stale: no live daemon for /p: " + "x" * 200
        + " -> run 'mps-health remediate reset node'"]


def test_a_terminal_line_fits_and_only_the_state_is_painted() -> None:
    lines = list(text.lines(BROKEN, width=50, colour=True))
    assert lines == ["MPS \x1b[1;31mCRITICAL\x1b[0m - 1 problem: daemon-stale node",
                     "\x1b[1;31mCRITICAL\x1b[0m daemon[node] daemon-stale: no live dae...",
                     "  -> run 'mps-health remediate reset node'",
                     "-v: every line whole, what is OK, timings"]
    plain = list(text.lines(BROKEN, width=50))
    assert [len(line) for line in plain] == [43, 50, 42, 41]
    verbose = list(text.lines(BROKEN, verbose=True, width=50, colour=True))
    assert verbose[1].endswith(" -> run 'mps-health remediate reset node'")
    assert verbose[2] == "\x1b[32mOK\x1b[0m directories[node]: fine"
    # A width too small to say anything is taken as NARROWEST.
    assert len(list(text.lines(BROKEN, width=3))[1]) == text.NARROWEST


def test_a_terminal_action_wraps_between_words_never_inside_a_command() -> None:
    argv = ("mps-health", "remediate", "reset", "gpu0", "--config", "/etc/my site.yaml")
    command = "'mps-health remediate reset gpu0 --config '/etc/my site.yaml''"
    action = f"run {command} (dry run first: --dry-run) (runbook: mps-health explain x)"
    lines = text.action_lines(action, 30, (argv,))
    assert lines[0] == "  -> run"  # the command does not fit after it: a line of its own
    assert lines[1] == "     " + command  # wider than 30: the terminal folds it, whole
    assert all(len(line) <= 30 for line in lines[2:]), lines
    assert " ".join(line.strip() for line in lines) == "-> " + action
    assert text.action_lines("", 80) == []


def test_the_summary_counts_what_it_lists() -> None:
    many = tuple(Result("directories", CRITICAL, code, "node", "m", "a")
                 for code in ("pipe-entry-foreign",) * 3 + tuple("abcdefgh"))
    line = text.summary_line(report(CheckRun("directories", many, 0.0)))
    assert line == ("MPS CRITICAL - 11 problems: pipe-entry-foreign node x3, a node, b node, "
                    "c node, d node, e node, +3 more")


def test_a_painted_name_is_only_ever_a_whole_state_name() -> None:
    assert text.paint("CRITIC...", CRITICAL, 0, True) == "CRITIC..."
    assert text.paint("CRITICAL x", CRITICAL, 0, False) == "CRITICAL x"


def actions(parser: argparse.ArgumentParser, where: str) -> Iterator[tuple]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from actions(sub, f"{where} {name}")
        else:
            yield where, action


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help(command: str) -> None:
    missing: List[str] = [f"{where} {'/'.join(a.option_strings) or a.dest}"
                          for where, a in actions(build([command]), "mps-health")
                          if not a.help]
    assert missing == []


def test_check_help_gives_the_exit_codes(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build(["check"]).parse_args(["check", "--help"])
    out = capsys.readouterr().out
    assert "Exit status: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN" in " ".join(out.split())
