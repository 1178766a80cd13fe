"""check_mps' output: one Report in the Nagios/Icinga plugin format.

``MPS <STATE> - summary | perfdata`` on the first line, long output after it (``-v``),
under 8 KiB in all (Nagios 4 keeps no more). Every result keeps the state its check
gave it. The one number judged here is the one the plugin conventions give to the
plugin itself: control latency against the ``-w``/``-c`` ranges, which also appear in
its perfdata. States combine as everywhere in mps-health: CRITICAL > WARNING > UNKNOWN
> OK (``results.worst``), so a node with a dead daemon and one unreadable fact is
broken, not unknown.

Pure and cheap: it only reads the Report (no engine run, no nagiosplugin, no ``re``).
"""

from __future__ import annotations

import math

from ..core.results import (
    CRITICAL,
    OK,
    STATE_NAMES,
    UNKNOWN,
    WARNING,
    Report,
    Result,
    is_problem,
    worst,
)
from .series import PREFIX, Sample, samples

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, NamedTuple, Optional, Sequence, Tuple
else:
    from ..core.frozen import NamedTuple

MAX_OUTPUT = 8192 - 1  # bytes Nagios 4 keeps of a plugin's output (MAX_PLUGIN_OUTPUT_LENGTH)
MAX_STATUS = 600  # bytes of status text before " | ": the rest goes to the long output
MAX_PERFDATA = 4096
SERVICE = "MPS"
_UOM = {"seconds": "s", "bytes": "B", "percent": "%"}
_INF = float("inf")
_RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}  # as results.worst ranks them


class Range(NamedTuple):
    """A monitoring-plugins threshold range: ``[@][start:][end]``, ``~`` for -infinity.

    ``10`` alerts outside 0..10, ``10:`` below 10, ``~:10`` above 10, ``10:20`` outside
    10..20, ``@10:20`` inside it. Numbers with a '.' are floats, others integers, so a
    range prints back as it was given.
    """

    invert: bool
    start: float
    end: float

    @classmethod
    def parse(cls, text: str) -> Range:
        """ValueError for anything that is not a range."""
        spec, invert = (text[1:], True) if text.startswith("@") else (text, False)
        start_text, sep, end_text = spec.rpartition(":") if ":" in spec else ("", "", spec)
        if sep and ":" in start_text:
            raise ValueError(f"invalid range {text!r}")
        start = -_INF if start_text == "~" else _atom(start_text, 0)
        end = _atom(end_text, _INF)
        if start > end:
            raise ValueError(f"start {start} must not be greater than end {end}")
        return cls(invert, start, end)

    @classmethod
    def up_to(cls, end: float) -> Range:
        """0..``end`` (``end`` a number, not text: a config value, twice -w), a whole
        number printed as one."""
        return cls(False, 0, int(end) if math.isfinite(end) and float(end).is_integer()
                   else end)

    def holds(self, value: float) -> bool:
        """True when ``value`` raises no alert."""
        return (self.start <= value <= self.end) != self.invert

    def text(self, zero_start: bool = False) -> str:
        out = "@" if self.invert else ""
        if self.start == -_INF:
            out += "~:"
        elif zero_start or self.start != 0:
            out += f"{_as_given(self.start)}:"
        return out + (_as_given(self.end) if self.end != _INF else "")


def _as_given(v: float) -> str:
    """``v`` as it was typed (10, 0.5), never in exponent notation (perfdata's [-0-9.])."""
    text = f"{v}"
    return _number(v) if "e" in text else text


def _atom(text: str, default: float) -> float:
    if text == "":
        return default
    value = float(text) if "." in text else int(text)
    try:
        finite = math.isfinite(value)  # 1.0e400 would read as "no limit", nan as "never"
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise ValueError(f"not a finite number: {text!r}")
    return value


class Thresholds(NamedTuple):
    """The -w/-c ranges for control latency, as given (or from the config)."""

    warning: Range
    critical: Optional[Range]


class Finding(NamedTuple):
    """One line of the plugin's findings: a check's result, or a latency over -w/-c."""

    state: int
    label: str  # "code instance", or the perfdata label of a number over its range
    message: str
    action: str = ""


# The plugin's headline number keeps the short label admins graph (node_latency).
PERF_ALIASES = {("control", "latency_s"): "latency"}


def perf_name(s: Sample) -> str:
    """The sample's name without instance: its metric name, less prefix and unit suffix."""
    alias = PERF_ALIASES.get((s.check, s.key))
    if alias is not None:
        return alias
    name = s.metric[len(PREFIX):]
    for suffix in ("_seconds", "_bytes"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def perf_labels(found: Sequence[Sample]) -> List[Tuple[str, Sample]]:
    """A stable perfdata label for each sample: INSTANCE[_GPU]_NAME (graphs key on it)."""
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
        words.append(perf_name(s))
        text = "_".join(words)
        out.append(("".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_"
                            for c in text), s))
    return out


def _number(v: float) -> str:
    """A perfdata number: plain decimal, never exponent notation (the guidelines' [-0-9.])."""
    if float(v).is_integer():
        return str(int(v))
    return (f"{v:.6f}".rstrip("0").rstrip(".")) or "0"


def _perf_item(label: str, value: str, uom: str, *rest: str) -> str:
    """``'label'=value[uom];warn;crit;min;max``, trailing empty fields dropped."""
    quoted = label if all(c.isalnum() or c == "_" for c in label) else f"'{label}'"
    fields = [f"{quoted}={value}{uom}", *rest]
    while fields[-1] == "":
        fields.pop()
    return ";".join(fields)


def numbers(report: Report, limits: Thresholds) -> Tuple[List[str], List[Finding]]:
    """(perfdata items, sorted as plugins print them; findings of latencies over -w/-c)."""
    perfdata: List[str] = []
    over: List[Finding] = []
    for label, s in perf_labels(samples(report)):
        uom = _UOM.get(s.unit, "")
        low = "0"
        if s.unit in ("", "percent") and s.value < 0:
            low = ""  # a signed number: no known minimum
        if s.check == "control" and s.key == "latency_s":
            crit = limits.critical
            perfdata.append(_perf_item(label, _number(s.value), uom, limits.warning.text(),
                                       crit.text() if crit else "", low))
            broken = (CRITICAL, crit) if crit is not None and not crit.holds(s.value) else \
                (WARNING, limits.warning) if not limits.warning.holds(s.value) else None
            if broken is not None:
                state, rng = broken
                over.append(Finding(state, label, f"{s.value:.4g}{uom} outside range "
                                                  f"{rng.text(zero_start=True)}"))
            continue
        high = {"flag": "1", "percent": "100"}.get(s.unit, "")
        perfdata.append(_perf_item(label, _number(s.value), uom, "", "", low, high))
    return sorted(perfdata), over


def _clean(text: str) -> str:
    """One line without '|', which would start perfdata."""
    return " ".join(text.replace("|", "/").split())


def _label(r: Result) -> str:
    return r.code + (f" {r.instance}" if r.instance else "")


def findings(report: Report, over: Sequence[Finding]) -> List[Finding]:
    """Every non-OK result, then every number over its range; worst first (stable)."""
    found = [Finding(r.state, _label(r), r.message, r.action)
             for run in report.runs for r in run.results if is_problem(r)]
    found += over
    found.sort(key=lambda f: -_RANK[f.state])
    return found


def summary(report: Report, found: Sequence[Finding]) -> str:
    if not found:
        return (f"{len(report.runs)} checks passed on {report.node} "
                f"in {report.duration_s:.2f}s")
    first = found[0]
    text = f"{first.label}: {first.message}"
    others = list(dict.fromkeys(f.label for f in found[1:] if f.label != first.label))
    if others:
        text += "; also " + ", ".join(others[:5]) + (f", +{len(others) - 5} more"
                                                     if len(others) > 5 else "")
    return _clean(text)


def long_output(report: Report, found: Sequence[Finding], verbose: int) -> List[str]:
    lines = [_clean(f"{STATE_NAMES[f.state]} {f.label}: {f.message}"
                    + (f" -> {f.action}" if f.action else "")) for f in found]
    for run in report.runs:
        for res in run.results:
            where = f"[{res.instance}]" if res.instance else ""
            if res.state == OK:
                lines.append(_clean(f"OK {res.check}{where}: {res.message}"))
            elif res.cause:  # folded under its cause: said, not counted, no action
                lines.append(_clean(f"FOLDED {res.check}{where} {res.code}: {res.message} "
                                    f"(follows from {res.cause})"))
    if verbose >= 2:
        spent = ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in sorted(report.gather_s.items()))
        lines.append(f"gathered: {spent or 'nothing'}; total {report.duration_s * 1000:.1f}ms")
    return lines


def fit(status: str, perfdata: Sequence[str], long_lines: Sequence[str]) -> str:
    """The plugin's output, cut to Nagios' limit without breaking a perfdata item."""
    status = _clean(status)
    if len(status.encode()) > MAX_STATUS:
        status = status.encode()[:MAX_STATUS - 3].decode("utf-8", "ignore") + "..."
    perf = ""
    for item in perfdata:
        if len((perf + " " + item).encode()) > MAX_PERFDATA:
            break
        perf = f"{perf} {item}" if perf else item
    first = f"{status} | {perf}" if perf else status
    out = [first]
    used = len(first.encode()) + 1
    for n, line in enumerate(long_lines):
        size = len(line.encode()) + 1
        left = len(long_lines) - n
        marker = f"... {left} more lines cut to stay under 8 KiB (run 'mps-health check -v')"
        if used + size + len(marker) + 1 > MAX_OUTPUT:
            out.append(marker)
            break
        out.append(line)
        used += size
    return "\n".join(out) + "\n"


def render(report: Report, limits: Thresholds, verbose: int = 0) -> Tuple[str, int]:
    """(the plugin's output, its exit code) for one run's Report."""
    if not any(run.results for run in report.runs):
        return unknown("no check results"), UNKNOWN
    perfdata, over = numbers(report, limits)
    found = findings(report, over)
    state = worst([report.state, *(f.state for f in over)])
    status = f"{SERVICE} {STATE_NAMES[state]} - {summary(report, found)}"
    lines = long_output(report, found, verbose) if verbose else []
    return fit(status, perfdata, lines), state


def unknown(text: str) -> str:
    """The whole output for a run that could not judge (bad arguments, timeout, ...)."""
    return f"{SERVICE} UNKNOWN - {_clean(text)}\n"
