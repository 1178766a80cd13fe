"""Prometheus: one run's Report as metric families, for /metrics and node_exporter's textfile.

Presentation only: it formats a ``RunRecord`` and never probes. Each call builds fresh
families, never through the global registry, so the textfile never repeats ``process_*``
series (node_exporter would drop the whole file). Names and labels: docs/metrics.md.
"""

import itertools
import os
import platform
from collections import Counter
from types import SimpleNamespace
from typing import Iterator, List, NamedTuple, Optional

from mps_health import __version__
from mps_health.engine import registry
from mps_health.exporters.series import PREFIX, Labels, labels_of, samples
from mps_health.model.results import STARTING, STATE_NAMES, UNKNOWN, Report
from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what Prometheus 2.x parses
TEXTFILE_NAME = "mps_health.prom"
LAST_SUCCESS = PREFIX + "last_success_timestamp_seconds"


class RunRecord(NamedTuple):
    """What one run left for the outputs: the report and the run's own health."""

    report: Optional[Report]  # None when the run itself failed (see error)
    finished_at: float  # Unix time the run ended
    success: bool  # every check could judge (no UNKNOWN): see run_success()
    last_success_at: Optional[float]  # this run's end if success, else the previous one's
    error: str = ""  # one line, when report is None
    # How long the last health check run took (its state file), where one has run here.
    healthcheck_s: Optional[float] = None


def run_success(report: Report) -> bool:
    """Did every check judge? An UNKNOWN result means the monitor itself is blind there."""
    return all(r.state != UNKNOWN or r.cause for run in report.runs for r in run.results)


def _value_families(report: Report) -> Iterator[Metric]:
    ordered = sorted(samples(report), key=lambda s: (s.metric, s.labels))
    for name, group in itertools.groupby(ordered, key=lambda s: s.metric):
        first, *rest = group
        spec = registry.checks().get(first.check)
        what = f" ({spec.summary})" if spec is not None and spec.summary else ""
        unit = {"seconds": ", in seconds", "bytes": ", in bytes", "percent": ", in percent",
                "flag": ", 1 or 0"}.get(first.unit, "")
        m = Metric(name, f"Value '{first.key}' of the {first.check} check{what}{unit}.", "gauge")
        for s in (first, *rest):
            m.add_sample(name, dict(s.labels), s.value)
        yield m


def _problem_family(report: Report, starting: bool = False) -> Metric:
    """The problems counted by check, code, state and instance; with ``starting``, the
    findings of units still starting after boot instead (no state label)."""
    if starting:
        name, doc = "starting", ("Findings of units still starting within healthcheck."
                                 "boot_grace_s of boot (not counted in problems or status; "
                                 "absent otherwise).")
        found = tuple(r for run in report.runs for r in run.results if r.cause == STARTING)
    else:
        name, doc = "problems", ("Findings that are not OK, by check, code and instance "
                                 "(absent when healthy); the code names the runbook entry.")
        found = report.problems()
    counts: Counter[Labels] = Counter()
    for r in found:
        state = () if starting else (("state", STATE_NAMES[r.state].lower()),)
        labels = (("check", r.check), ("code", r.code), *state,
                  *labels_of(r.instance, r.labels, report.instance_gpus))
        counts[labels] += 1
    m = Metric(PREFIX + name, doc, "gauge")
    for labels in sorted(counts):
        m.add_sample(PREFIX + name, dict(labels), float(counts[labels]))
    return m


def _report_families(report: Report) -> Iterator[Metric]:
    yield GaugeMetricFamily(PREFIX + "status", "Worst state of the last run: 0 OK, 1 WARNING, "
                 "2 CRITICAL, 3 UNKNOWN (Nagios codes).", value=report.state)
    yield GaugeMetricFamily(PREFIX + "run_duration_seconds", "Time the last run took, "
                            "gathering and judging.", value=report.duration_s)
    status = Metric(PREFIX + "check_status", "State of each check in the last run: "
                    "0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.", "gauge")
    success = Metric(PREFIX + "check_success", "1 when the check could judge (no UNKNOWN "
                     "result), as node_scrape_collector_success.", "gauge")
    duration = Metric(PREFIX + "check_duration_seconds", "Time each check took to judge.",
                      "gauge")
    for run in sorted(report.runs, key=lambda r: r.name):
        labels = {"check": run.name}
        status.add_sample(status.name, labels, float(run.state))
        judged = run.error is None and all(r.state != UNKNOWN or r.cause for r in run.results)
        success.add_sample(success.name, labels, 1.0 if judged else 0.0)
        duration.add_sample(duration.name, labels, run.duration_s)
    yield from (status, success, duration)
    sources = Metric(PREFIX + "source_duration_seconds", "Time spent gathering each "
                     "fact source in the last run.", "gauge")
    for name in sorted(report.gather_s):
        sources.add_sample(sources.name, {"source": name}, report.gather_s[name])
    yield sources
    yield _problem_family(report)
    yield _problem_family(report, starting=True)
    yield from _value_families(report)


def families(record: Optional[RunRecord]) -> List[Metric]:
    """Every family for one scrape or one textfile (only build info before the first run)."""
    info = GaugeMetricFamily(PREFIX + "build_info", "mps-health version, as a label; always 1.",
                             labels=["version", "python"])
    info.add_metric([__version__, platform.python_version()], 1)
    out: List[Metric] = [info]
    if record is None:
        return out
    for name, doc, value in (
            ("last_run_timestamp_seconds", "Unix time the last run ended (alert when it stops "
             "moving).", record.finished_at),
            ("last_success_timestamp_seconds", "Unix time of the last run in which every "
             "check could judge.", record.last_success_at),
            ("run_success", "1 when every check of the last run could judge, 0 when one was "
             "UNKNOWN or the run failed.", float(record.success)),
            ("healthcheck_duration_seconds", "Time the last run of mps-health-healthcheck "
             "(slurmd's HealthCheckProgram) took; slurmd kills it at 60 s.",
             record.healthcheck_s)):
        if value is not None:  # no success yet, no health check run here: no series
            out.append(GaugeMetricFamily(PREFIX + name, doc, value=value))
    if record.report is not None:
        out.extend(_report_families(record.report))
    return out


def latest(metrics: List[Metric], process: bool = False) -> bytes:
    """``metrics`` in the text exposition format (0.0.4), no global registry: no process_*
    or python_* series unless ``process`` (the exporter's own, fresh from /proc/self)."""
    if process:
        metrics = [*ProcessCollector(registry=None).collect(), *metrics]
    return generate_latest(SimpleNamespace(collect=lambda: metrics))  # a one-off collector


def exposition(record: Optional[RunRecord]) -> bytes:
    """The text exposition format (0.0.4) of one record."""
    return latest(families(record))


def write_textfile(directory: str, record: RunRecord) -> str:
    """Write DIR/mps_health.prom with ``safefiles.write_atomic``; returns the path.
    (prometheus_client's write_to_textfile opens a predictable temp name, following links.)"""
    from mps_health.hostio.safefiles import write_atomic

    path = os.path.abspath(os.path.join(directory, TEXTFILE_NAME))
    write_atomic(path, exposition(record))
    return path


def parse_last_success(text: str) -> Optional[float]:
    """The last-success timestamp a previous textfile recorded, if any (pure)."""
    for line in text.splitlines():
        if line.startswith(LAST_SUCCESS + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def read_last_success(directory: str) -> Optional[float]:
    from mps_health.hostio.safefiles import read_small

    try:
        raw = read_small(os.path.join(directory, TEXTFILE_NAME))
        return None if raw is None else parse_last_success(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
