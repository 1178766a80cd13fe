"""``mps-health check`` on a terminal (a pty): short problem lines that fit its width,
each followed by what to do (wrapped, a command never split), colour unless NO_COLOR,
every line whole with -v; piped, the lines stay as slurmd and scripts read them. The
snapshot is a dead daemon (its control-absent folded under it) and a pipe dir's mode."""

import re

from clirun import mps_health
from conftest import REPO
from ptyrun import on_pty

BROKEN = str(REPO / "examples" / "broken-node.json")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ACTION = " -> run 'mps-health remediate "  # reset, or dirs for the pipe dir's mode


def whole(line: str) -> bool:
    """A problem line with its action and, last, where to read more about its code."""
    code = line.split()[2].rstrip(":")
    return ACTION in line and line.endswith(f"(runbook: mps-health explain {code})")


def test_a_terminal_gets_short_coloured_problem_lines_and_what_to_do() -> None:
    code, lines = on_pty("check", "--replay", BROKEN, columns=80)
    assert code == 2
    plain = [ANSI.sub("", line) for line in lines]
    assert all(len(line) <= 80 for line in plain), plain
    assert lines[0] == ("MPS \x1b[1;31mCRITICAL\x1b[0m - 2 problems: daemon-stale node, "
                        "pipe-dir-mode node")
    assert lines[1].startswith("\x1b[1;31mCRITICAL\x1b[0m daemon[node] daemon-stale: no live ")
    assert plain[1].endswith("...")  # cut to the width: the rest is -v's
    # What to do, under it: the command whole on one line, to paste.
    assert plain[2] == "  -> run 'mps-health remediate reset node' (dry run first: --dry-run) " \
        "(runbook:"
    assert plain[3] == "     mps-health explain daemon-stale)"
    assert plain[4].startswith("CRITICAL directories[node] pipe-dir-mode: ")
    assert plain[5].startswith("  -> run 'mps-health remediate dirs node' (dry run first")
    assert plain[-1] == "-v: every line whole, what is OK, timings"
    assert len(lines) == 8


def test_no_color_and_a_dumb_terminal_get_no_colour() -> None:
    for env in ({"NO_COLOR": "1"}, {"TERM": "dumb"}):
        code, lines = on_pty("check", "--replay", BROKEN, columns=100, env=env)
        assert code == 2 and lines, env
        assert not any("\x1b" in line for line in lines), (env, lines)
        assert all(len(line) <= 100 for line in lines)
    # An empty NO_COLOR is unset (no-color.org): colour.
    _, lines = on_pty("check", "--replay", BROKEN, env={"NO_COLOR": ""})
    assert "\x1b[1;31m" in lines[0]


def test_columns_overrides_the_terminal_width() -> None:
    _, lines = on_pty("check", "--replay", BROKEN, columns=200, env={"COLUMNS": "60",
                                                                       "NO_COLOR": "1"})
    assert max(len(line) for line in lines) == 60, lines


def test_verbose_on_a_terminal_gives_every_detail() -> None:
    code, lines = on_pty("check", "--replay", BROKEN, "-v", columns=80, env={"NO_COLOR": "1"})
    assert code == 2
    problems = [line for line in lines if line.startswith("CRITICAL ")]
    assert len(problems) == 2 and all(whole(line) for line in problems), lines
    assert "-v: every line whole, what is OK, timings" not in lines
    assert not any(line.startswith("  -> ") for line in lines)  # each action on its line
    assert lines[-1].startswith("gathered: ")


def test_piped_output_is_unchanged() -> None:
    r = mps_health("check", "--replay", BROKEN, env={"TERM": "xterm"})
    assert r.returncode == 2 and "\x1b" not in r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(whole(line) for line in lines[1:]), lines
    assert lines[1].startswith("CRITICAL daemon[node] daemon-stale: no live "
                               "nvidia-cuda-mps-control for ")
    assert len(lines[1]) > 200  # whole: slurmd's log and scripts read every word


def test_json_on_a_terminal_is_plain_json() -> None:
    code, lines = on_pty("check", "--replay", BROKEN, "--format", "json", columns=40)
    assert code == 2 and lines[0].startswith("{") and not any("\x1b" in ln for ln in lines)
