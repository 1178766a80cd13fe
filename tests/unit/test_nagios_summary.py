"""check_mps' status line: the worst finding, then the others by code only (a latency
over -w/-c is named by its code, control-slow, never by a perfdata label)."""

from mps_health.exporters import nagios
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, CheckRun, Report, Result


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
