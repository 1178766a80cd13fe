"""check_mps' status line: the worst finding and what to do about it (what a pager shows),
then the others by code only, each with its count (a latency over -w/-c is named by its
code, control-slow, never by a perfdata label); what the boot grace excuses is said
without -v."""

from mps_health.exporters import nagios
from mps_health.model.results import (
    CRITICAL,
    OK,
    STARTING,
    UNKNOWN,
    WARNING,
    CheckRun,
    Report,
    Result,
)


def _report(*results: Result) -> Report:
    return Report("n1", 0.0, 0.1, tuple(CheckRun(r.check, (r,), 0.0) for r in results), {},
                  "test")


def _render(report: Report, verbose: int = 0):
    warning, critical = nagios.thresholds("0.5", "1", 1.0)
    return nagios.render(nagios.Probe(lambda: report), warning, critical, verbose)


def test_the_nagios_summary_names_codes_not_perfdata_labels() -> None:
    """A wedged daemon's latency is also over -c, but the summary lists codes only."""
    out, state = _render(_report(
        Result("control", CRITICAL, "control-wedged", "node", "no answer within 2.0s", "",
               (("latency_s", 2.0),)),
        Result("daemon", CRITICAL, "daemon-stopped", "node", "stopped", ""),
        Result("servers", UNKNOWN, "servers-not-asked", "node", "not asked", "")), 1)
    lines = out.splitlines()
    assert state == CRITICAL
    assert lines[0] == ("MPS CRITICAL - control-wedged node: no answer within 2.0s; also "
                        "daemon-stopped node, control-slow node, servers-not-asked node")
    assert "node_latency" not in lines[0]
    assert "node_latency=2s;0.5;1;0" in lines[-1].lstrip("| ").split()
    assert "CRITICAL control-slow node: latency 2s outside range 0:1" in lines  # long output


def test_a_latency_alone_over_its_range_leads_the_summary() -> None:
    out, state = _render(_report(
        Result("control", OK, "ok", "node", "answered", "", (("latency_s", 0.8),))))
    assert state == WARNING
    assert out.split(" | ")[0] == "MPS WARNING - control-slow node: latency 0.8s outside " \
        "range 0:0.5"


def status(out: str) -> str:
    return out.splitlines()[0].split(" | ")[0]


RESET = "run 'mps-health remediate reset node' (dry run first: --dry-run) " \
    "(runbook: mps-health explain daemon-stale)"


def test_the_status_line_carries_the_first_action_whole() -> None:
    out, _ = _render(_report(
        Result("daemon", CRITICAL, "daemon-stale", "node", "no live daemon", RESET),
        Result("directories", CRITICAL, "pipe-entry-foreign", "node", "x", "y"),
        Result("directories", CRITICAL, "pipe-entry-foreign", "node", "z", "y")))
    assert status(out) == (f"MPS CRITICAL - daemon-stale node: no live daemon -> "
                                   f"{RESET}; also pipe-entry-foreign node x2")
    # A long message is cut so that the action stays whole within the status line's size.
    out, _ = _render(_report(
        Result("daemon", CRITICAL, "daemon-stale", "node", "no live daemon " + "x" * 900, RESET)))
    line = status(out)
    assert line.endswith("x... -> " + RESET) and len(line.encode()) <= len("MPS CRITICAL - ") + nagios.MAX_STATUS
    # An action that cannot fit at all gives way to its runbook pointer.
    out, _ = _render(_report(
        Result("daemon", CRITICAL, "daemon-stale", "node", "m", "y" * 700 + " (runbook: "
               "mps-health explain daemon-stale)")))
    assert status(out) == "MPS CRITICAL - daemon-stale node: m -> mps-health explain " \
        "daemon-stale"


def test_initializing_lines_are_said_without_verbose() -> None:
    """In the boot grace check_mps is OK and says what is still coming up, as text does."""
    waiting = Result("directories", CRITICAL, "pipe-dir-missing", "node", "pipe dir /p does not "
                     "exist", cause=STARTING)
    fine = Result("daemon", OK, "ok", "node", "fine")
    out, state = _render(_report(fine, waiting))
    lines = out.splitlines()
    assert state == OK and lines[0].startswith("MPS OK - 1 check passed on n1")
    assert lines[1].startswith("INITIALIZING directories[node] pipe-dir-missing: pipe dir /p "
                               "does not exist (the node is booting"), lines
    assert len(lines) == 2
    verbose, _ = _render(_report(fine, waiting), 1)
    assert sum(ln.startswith("INITIALIZING ") for ln in verbose.splitlines()) == 1
