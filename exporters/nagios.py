"""check_mps' output: one Report as a nagiosplugin Check, in the Nagios plugin format.

nagiosplugin does the plugin API (contexts, ranges, perfdata, layout). Ours: results keep
their checks' states (``Reported``), combined as ``results.worst`` (``Check``: nagiosplugin
puts UNKNOWN above CRITICAL); the status line names codes, latency over -w/-c is
``control-slow`` (``Headline``); plain decimals (``Number``); 8 KiB at most (``fit``). Not
nagiosplugin's Runtime (one per process, SIGALRM, tracebacks).
"""

from __future__ import annotations

import io
import logging
import math
import re
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import nagiosplugin
from mps_health.exporters.series import PREFIX, Sample, samples
from mps_health.exporters.text import counted, folded_line, gathered, ok_line, passed
from mps_health.model.actionhints import with_options
from mps_health.model.results import OK, STARTING, Report, Result, is_problem, worst
from nagiosplugin.output import Output

MAX_OUTPUT = 8192 - 1  # bytes Nagios 4 keeps of a plugin's output (MAX_PLUGIN_OUTPUT_LENGTH)
MAX_STATUS = 600  # bytes of the summary: the rest of the findings are in the long output
MAX_PERFDATA = 4096
MIN_MESSAGE = 120  # bytes of the first finding's message kept before its action goes
RUNBOOK = re.compile(r"\(runbook: (mps-health explain \S+)\)\Z")
SERVICE = "MPS"
SLOW = "control-slow"  # the code of a control latency over -w/-c (the control check's)
_UOM = {"seconds": "s", "bytes": "B", "percent": "%"}
# mps-health's states are the plugin API's exit codes, as nagiosplugin's are.
STATES = {int(s): s for s in (nagiosplugin.Ok, nagiosplugin.Warn, nagiosplugin.Critical,
                              nagiosplugin.Unknown)}


def plain(v: float) -> str:
    """``v`` as a plain decimal, never in exponent notation: 1e-05 is 0.00001, 2.0 is 2."""
    text = repr(float(v))
    if "e" in text:  # below 0.0001, or from 1e16
        text = f"{v:.20f}".rstrip("0")
    return text[:-2] if text.endswith(".0") else text.rstrip(".")


class Number(float):
    """A number nagiosplugin prints plainly; ``sample``: where in the Report it is from."""

    sample: Optional[Sample] = None

    def __str__(self) -> str:
        return plain(self)


class Range(nagiosplugin.Range):
    """nagiosplugin's range, its numbers printed back plain (0.00001 stays 0.00001), a
    number beyond a float refused (nagiosplugin reads 1.0e400 as no limit)."""

    @staticmethod
    def _parse_atom(atom: str, default: float) -> float:
        value = nagiosplugin.Range._parse_atom(atom, default)
        if atom and not math.isfinite(float(atom)):
            raise ValueError(f"not a finite number: {atom!r}")
        return Number(value) if isinstance(value, float) else value


def thresholds(warning: Optional[str], critical: Optional[str], default_s: float
               ) -> Tuple[Range, Range]:
    """The -w/-c ranges; without -w 0..``default_s`` (written plainly: "%g" writes 1e-05
    or inf, which a range does not take), without -c 0..twice the warning's end."""
    warn = Range(plain(default_s) if warning is None and math.isfinite(default_s) else warning)
    twice = plain(2 * warn.end) if math.isfinite(warn.end) else ""
    return warn, Range(twice if critical is None else critical)


# The plugin's headline number keeps the short label admins graph (node_latency).
PERF_ALIASES = {("control", "latency_s"): "latency"}


def perf_labels(found: Sequence[Sample]) -> List[Tuple[str, Sample]]:
    """A stable perfdata label for each sample: INSTANCE[_GPU]_NAME (graphs key on it), NAME
    its metric name less prefix and unit suffix."""
    out = []
    for s in found:
        if s.key.endswith("_pid"):
            continue  # an id, not a measurement
        labels = dict(s.labels)
        words = [s.instance] if s.instance else []
        gpu = labels.get("gpu")
        if gpu is not None and s.instance != f"gpu{gpu}":
            words.append(f"gpu{gpu}")
        elif gpu is None and "UUID" in labels:
            words.append(labels["UUID"])
        words += [v for k, v in s.labels if k not in ("mps_instance", "gpu", "UUID")]
        words.append(PERF_ALIASES.get((s.check, s.key))
                     or re.sub(r"_(seconds|bytes)\Z", "", s.metric[len(PREFIX):]))
        out.append((re.sub(r"[^A-Za-z0-9_.-]", "_", "_".join(words)), s))
    return out


def metrics(report: Report) -> Iterator[Any]:
    """Per result a ``judged`` metric; per number a ``latency`` or ``measured`` one."""
    for run in report.runs:
        for r in run.results:
            if r.state == OK or is_problem(r):  # one folded under its cause is not judged
                yield nagiosplugin.Metric(r.code, r, context="judged")
    for label, s in perf_labels(samples(report)):
        value = Number(s.value)
        value.sample = s
        low = None if s.unit in ("", "percent") and s.value < 0 else 0  # signed: no minimum
        high = {"flag": 1, "percent": 100}.get(s.unit)
        latency = (s.check, s.key) == ("control", "latency_s")
        yield nagiosplugin.Metric(label, value, _UOM.get(s.unit, ""), low, high,
                                  context="latency" if latency else "measured")


class Probe(nagiosplugin.Resource):
    """The Resource: the metrics of the Report ``report()`` makes, kept for the summary."""

    judged: Report

    def __init__(self, report: Callable[[], Report]) -> None:
        self.report = report

    def probe(self) -> List[Any]:
        self.judged = self.report()
        return list(metrics(self.judged))


class Reported(nagiosplugin.Context):
    """``judged``: a result, in the state its check gave it. ``measured``: a number shown,
    not judged (its result was; nagiosplugin's default context reads -1 as CRITICAL)."""

    def evaluate(self, metric: Any, resource: Any) -> Any:
        if self.name == "judged":
            return nagiosplugin.Result(STATES[metric.value.state], metric.value.message, metric)
        return nagiosplugin.Result(nagiosplugin.Ok, metric=metric)

    def performance(self, metric: Any, resource: Any) -> Any:
        if self.name == "measured":
            return nagiosplugin.Performance(metric.name, metric.value, metric.uom,
                                            min=metric.min, max=metric.max)
        return None


def _clean(text: str) -> str:
    """One line without '|', which would start perfdata."""
    return " ".join(text.replace("|", "/").split())


def said(result: Any) -> Tuple[str, str, str]:
    """(label, message, action) of a nagiosplugin result: a code, never a perfdata label."""
    metric = result.metric
    if metric is not None and metric.context == "judged":
        r: Result = metric.value
        return f"{r.code} {r.instance}".strip(), r.message, r.action
    if metric is not None and metric.context == "latency":
        return (f"{SLOW} {metric.value.sample.instance}".strip(),
                f"latency {metric.valueunit} {result.hint}", "")
    return "", str(result), ""  # nagiosplugin's own (a CheckError in a resource)


def findings(results: Any) -> List[Any]:
    """The results that are not OK, worst first in results.worst's order (stable)."""
    return sorted((r for r in results.results if r.state != nagiosplugin.Ok), reverse=True,
                  key=lambda r: sum(worst([int(r.state), s]) == int(r.state) for s in STATES))


class Headline(nagiosplugin.Summary):
    """The status line (codes, worst first); long output: findings, actions, OK results."""

    def __init__(self, probe: Probe, verbose: int) -> None:
        self.probe, self.level = probe, verbose

    def ok(self, results: Any) -> str:
        return passed(self.probe.judged)  # as `mps-health check` says it

    def problem(self, results: Any) -> str:
        """The first finding, what to do about it (what a pager shows), then the others'
        labels, each with its count."""
        found = [said(r) for r in findings(results)]
        first, message, action = found[0]
        others = counted((f[0] for f in found[1:] if f[0]), 5)
        return status_text(f"{first}: " if first else "", _clean(message), _clean(action),
                           f"; also {others}" if others else "")

    def verbose(self, results: Any) -> List[str]:
        lines = []
        for r in findings(results):
            label, message, action = said(r)
            lines.append(_clean(f"{str(r.state).upper()} {label + ': ' if label else ''}"
                                f"{message}" + (f" -> {action}" if action else "")))
        report = self.probe.judged
        for run in report.runs:
            for res in run.results:
                if res.state == OK:
                    lines.append(_clean(ok_line(res)))
                elif res.cause:  # folded under its cause, or still starting after boot: said,
                    lines.append(_clean(folded_line(res)))  # not counted, no action
        if self.level >= 2:
            lines.append(gathered(report))
        return lines


def cut(text: str, size: int) -> str:
    """``text`` within ``size`` bytes of UTF-8, "..." saying it was cut."""
    if len(text.encode()) <= size:
        return text
    return text.encode()[:max(0, size - 3)].decode("utf-8", "ignore") + "..."


def status_text(head: str, message: str, action: str, tail: str) -> str:
    """The status line's text within MAX_STATUS: the message is cut first, so the action
    stays whole; an action that cannot fit gives its runbook pointer (``mps-health
    explain CODE``) instead, and the others' labels are cut last."""
    todo = f" -> {action}" if action else ""
    room = MAX_STATUS - len((head + todo + tail).encode())
    if todo and room < MIN_MESSAGE:
        pointer = RUNBOOK.search(action)
        todo = f" -> {pointer.group(1)}" if pointer else ""
        room = MAX_STATUS - len((head + todo + tail).encode())
    return cut(head + cut(message, max(room, MIN_MESSAGE)) + todo + tail, MAX_STATUS)


class Check(nagiosplugin.Check):
    """nagiosplugin's Check: mps-health's state order, perfdata whole within MAX_PERFDATA."""

    perfdata: List[str]  # set by nagiosplugin's Check: sorted items, as printed

    @property
    def state(self) -> Any:
        if not self.results:
            return nagiosplugin.Unknown
        return STATES[worst([int(r.state) for r in self.results])]

    @property
    def exitcode(self) -> int:
        return int(self.state)

    def __call__(self) -> None:
        super().__call__()
        while len(" ".join(self.perfdata).encode()) > MAX_PERFDATA:
            self.perfdata.pop()


def fit(text: str, options: Tuple[Tuple[str, str], ...] = ()) -> str:
    """Within Nagios' limit: long output is cut; the status and perfdata lines stay whole.
    The last line names the command that shows it all, with the run's ``options``."""
    head, *body = text.rstrip("\n").split("\n")
    tail = [body.pop()] if body and body[-1].startswith("| ") else []
    used = sum(len(line.encode()) + 1 for line in [head, *tail])
    for n, line in enumerate(body):
        used += len(line.encode()) + 1
        marker = with_options(f"... {len(body) - n} more lines cut to stay under 8 KiB "
                              "(run 'mps-health check -v')", options)
        if used + len(marker) + 1 > MAX_OUTPUT:
            body[n:] = [marker]
            break
    return "\n".join([head, *body, *tail]) + "\n"


def render(probe: Probe, warning: Range, critical: Range, verbose: int = 0) -> Tuple[str, int]:
    """(output, exit code); nagiosplugin's log lines go in the output, as its Runtime does."""
    latency = nagiosplugin.ScalarContext("latency", warning, critical)
    check = Check(probe, Reported("judged"), Reported("measured"), latency,
                  Headline(probe, verbose), name=SERVICE)
    log = logging.StreamHandler(io.StringIO())
    logging.getLogger("nagiosplugin").addHandler(log)
    try:
        check()
    finally:
        logging.getLogger("nagiosplugin").removeHandler(log)
    output = Output(log, verbose)
    output.add(check)
    judged = getattr(probe, "judged", None)
    if judged is not None and not verbose:
        # What the boot grace excuses is always said (-v says it among the rest): a
        # status OK while a unit is still coming up is not the same as one that is up.
        output.add_longoutput([_clean(folded_line(r)) for run in judged.runs
                               for r in run.results if r.cause == STARTING])
    return fit(str(output), judged.options if judged is not None else ()), check.exitcode


def unknown(text: str) -> str:
    """The whole output for a run that could not judge (bad arguments, timeout, ...)."""
    return f"{SERVICE} UNKNOWN - {_clean(text)}\n"
