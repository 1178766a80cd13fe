"""check_mps' output: one Report as a nagiosplugin Check, in the Nagios plugin format.

Only nagiosplugin's public API. Ours: results keep their checks' states, combined in
mps-health's order (``overall``: nagiosplugin puts UNKNOWN above CRITICAL); -w/-c are
our ``Range`` (plain decimals, finite numbers); latency over them is ``control-slow``;
the layout is written here, each line screened (``_clean``), 8 KiB at most (``fit``).
Not nagiosplugin's Runtime (one per process, SIGALRM, tracebacks).
"""

from __future__ import annotations

import io
import logging
import math
import re
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import nagiosplugin
from mps_health.engine.actionhints import VERBOSE, given, quoted
from mps_health.exporters.series import PREFIX, Sample, samples
from mps_health.exporters.text import counted, folded_line, gathered, ok_line, passed
from mps_health.model.printable import printable
from mps_health.model.results import OK, STARTING, Report, Result, is_problem, worst

MAX_OUTPUT = 8192 - 1  # bytes Nagios 4 keeps of a plugin's output (MAX_PLUGIN_OUTPUT_LENGTH)
MAX_STATUS = 600  # bytes of the summary: the rest of the findings are in the long output
MAX_PERFDATA = 4096
MIN_MESSAGE = 120  # bytes of the first finding's message kept before its action goes
RUNBOOK = re.compile(r"\(runbook: (mps-health explain \S+)\)\Z")
SERVICE = "MPS"
SLOW = "control-slow"  # the code of a control latency over -w/-c (the control check's)
_UOM = {"seconds": "s", "bytes": "B", "percent": "%"}
# What a Resource raises when it cannot measure (check_mps: a run past -t): UNKNOWN.
CheckError = nagiosplugin.CheckError
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
    """nagiosplugin's monitoring-plugins range, ``[@][start:][end]``, its numbers printed
    back plain (0.00001 stays 0.00001, never 1e-05) and a number beyond a float refused
    (nagiosplugin reads 1.0e400 as no limit)."""

    def __new__(cls, spec: Optional[str] = "") -> Range:
        if any(atom not in ("", "~") and not math.isfinite(float(atom))
               for atom in (spec or "").removeprefix("@").split(":")):
            raise ValueError(f"not a finite number: {spec!r}")
        return super().__new__(cls, spec)

    def text(self, omit_zero_start: bool = True) -> str:
        out = "@" if self.invert else ""
        if self.start == float("-inf"):
            out += "~:"
        elif not omit_zero_start or self.start != 0:
            out += f"{plain(self.start)}:"
        return out + (plain(self.end) if self.end != float("inf") else "")

    def __str__(self) -> str:
        return self.text()

    @property
    def violation(self) -> str:
        """Why a value does not match, worded as nagiosplugin's ScalarContext words it."""
        return f"outside range {self.text(omit_zero_start=False)}"


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


def latency(warning: Range, critical: Range) -> Any:
    """The control daemon's answer time against -w/-c: nagiosplugin's ScalarContext, with
    our ``Range``s set after it is made (its constructor would copy them into its own)."""
    context = nagiosplugin.ScalarContext("latency")
    context.warning, context.critical = warning, critical
    return context


def _clean(text: str) -> str:
    """One line of ours that may carry what users control: no '|' (it would start
    perfdata), whitespace (line breaks too) one space, anything else non-printable escaped
    (no forged line, no terminal code); our own screening, not nagiosplugin's."""
    return printable(" ".join(text.replace("|", "/").split()))


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
    return sorted((r for r in results if r.state != nagiosplugin.Ok), reverse=True,
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
        report = getattr(self.probe, "judged", None)
        if report is None:  # the Probe raised CheckError (an overrun): the status says it
            return []
        lines = []
        for r in findings(results):
            label, message, action = said(r)
            lines.append(_clean(f"{str(r.state).upper()} {label + ': ' if label else ''}"
                                f"{message}" + (f" -> {action}" if action else "")))
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


def overall(results: Any) -> Any:
    """The check's state in mps-health's order (results.worst: CRITICAL > WARNING > UNKNOWN
    > OK; nagiosplugin's Check puts UNKNOWN first); UNKNOWN without results."""
    states = [int(r.state) for r in results]
    return STATES[worst(states)] if states else nagiosplugin.Unknown


def within(perfdata: Sequence[str], size: int) -> List[str]:
    """The first perfdata items (sorted, as the Check gives them) that fit in ``size``
    bytes: each whole, never one cut."""
    kept = list(perfdata)
    while len(" ".join(kept).encode()) > size:
        kept.pop()
    return kept


def layout(status: str, long_output: Sequence[str], perfdata: Sequence[str],
           verbose: int) -> str:
    """The plugin API's output, laid out as nagiosplugin lays it out: the status line, with
    the perfdata after " | " without -v, else the long output then "| perfdata" last."""
    perf = f"| {' '.join(perfdata)}" if perfdata else ""
    if not verbose:
        return "\n".join([f"{status} {perf}".rstrip(), *long_output]) + "\n"
    return "\n".join(line for line in [status, *long_output, perf] if line) + "\n"


def fit(text: str, options: Tuple[Tuple[str, str], ...] = ()) -> str:
    """Within Nagios' limit: long output is cut; the status and perfdata lines stay whole.
    The last line names the command that shows it all, with the run's ``options``."""
    head, *body = text.rstrip("\n").split("\n")
    tail = [body.pop()] if body and body[-1].startswith("| ") else []
    used = sum(len(line.encode()) + 1 for line in [head, *tail])
    see_all = quoted(given(VERBOSE, options))
    for n, line in enumerate(body):
        used += len(line.encode()) + 1
        marker = f"... {len(body) - n} more lines cut to stay under 8 KiB (run {see_all})"
        if used + len(marker) + 1 > MAX_OUTPUT:
            body[n:] = [marker]
            break
    return "\n".join([head, *body, *tail]) + "\n"


def render(probe: Probe, warning: Range, critical: Range, verbose: int = 0) -> Tuple[str, int]:
    """(output, exit code); nagiosplugin's log lines go in the long output, as its Runtime
    puts them."""
    check = nagiosplugin.Check(probe, Reported("judged"), Reported("measured"),
                               latency(warning, critical), Headline(probe, verbose),
                               name=SERVICE)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("nagiosplugin").addHandler(handler)  # the logger its docs name
    try:
        check()
    finally:
        logging.getLogger("nagiosplugin").removeHandler(handler)
    state = overall(check.results)
    summary = check.summary_str.strip()
    status = _clean(f"{SERVICE} {str(state).upper()}" + (f" - {summary}" if summary else ""))
    long_output = list(check.verbose_str) if verbose else []
    judged = getattr(probe, "judged", None)
    if judged is not None and not verbose:
        # What the boot grace excuses is always said (-v says it among the rest): a
        # status OK while a unit is still coming up is not the same as one that is up.
        long_output += [folded_line(r) for run in judged.runs for r in run.results
                        if r.cause == STARTING]
    long_output += log.getvalue().splitlines()
    text = layout(status, [_clean(line) for line in long_output if line.strip()],
                  within(check.perfdata, MAX_PERFDATA), verbose)
    return fit(text, judged.options if judged is not None else ()), int(state)
