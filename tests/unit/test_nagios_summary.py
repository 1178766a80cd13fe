"""check_mps' status line: the worst finding, then the others by code only."""

from mps_health.core.results import CRITICAL, OK, UNKNOWN, CheckRun, Report, Result
from mps_health.exporters import nagios


def _report(*results: Result) -> Report:
    return Report("n1", 0.0, 0.1, tuple(CheckRun(r.check, (r,), 0.0) for r in results), {},
                  "test")


def test_the_nagios_summary_names_codes_not_perfdata_labels() -> None:
    """A wedged daemon's latency is also over -c, but the summary lists codes only."""
    limits = nagios.Thresholds(nagios.Range.parse("0.5"), nagios.Range.parse("1"))
    out, state = nagios.render(_report(
        Result("control", CRITICAL, "control-wedged", "node", "no answer within 2.0s", "",
               (("latency_s", 2.0),)),
        Result("daemon", CRITICAL, "daemon-stopped", "node", "stopped", ""),
        Result("servers", UNKNOWN, "servers-not-asked", "node", "not asked", "")), limits, 1)
    status, perfdata = out.splitlines()[0].split(" | ")
    assert state == CRITICAL
    assert status == ("MPS CRITICAL - control-wedged node: no answer within 2.0s; also "
                      "daemon-stopped node, servers-not-asked node")
    assert "node_latency=2s;0.5;1;0" in perfdata.split()
    assert "CRITICAL node_latency: 2s outside range 0:1" in out.splitlines()  # long output


def test_a_latency_alone_over_its_range_leads_the_summary() -> None:
    limits = nagios.Thresholds(nagios.Range.parse("0.5"), nagios.Range.parse("1"))
    out, state = nagios.render(_report(
        Result("control", OK, "ok", "node", "answered", "", (("latency_s", 0.8),))), limits)
    assert state == 1
    assert out.split(" | ")[0] == "MPS WARNING - node_latency: 0.8s outside range 0:0.5"
