"""check_mps: the Nagios/Icinga plugin, in monitoring-plugins' conventions, on nagiosplugin.

Output: ``MPS <STATE> - summary | perfdata`` on one line, long output with ``-v``, under
8 KiB; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. Bad arguments, ``-h`` and ``-V`` exit
3, as monitoring-plugins' do.

nagiosplugin's stages carry the work: ``MpsNode.probe()`` runs the engine once and yields
one Metric per check result and one per number in ``Result.values``; contexts judge them
(a result keeps the state its check gave; control latency is judged by ``-w``/``-c`` in
the standard range syntax); ``MpsSummary`` words the status line.

nagiosplugin's ``Runtime`` (1.4.0) is not used: it is a
process-wide singleton (two runs in one process pile up perfdata), it prints ``NAME
UNKNOWN: text`` plus a traceback in verbose mode, argparse exits 2 (CRITICAL to Nagios),
it ranks UNKNOWN above CRITICAL (we rank CRITICAL > WARNING > UNKNOWN, see results.py) and
it has no output limit. ``main`` owns those: arguments, the timeout (nagiosplugin's own
whole-second SIGALRM ``with_timeout``), the 8 KiB limit and the exit code.

Time: the engine's budget is set below ``-t``, so a wedged daemon is reported CRITICAL
(control-wedged) inside the plugin's time; only the plugin overrunning ``-t`` itself is
UNKNOWN.
"""

import argparse
import sys
from typing import Any, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

import nagiosplugin
from mps_health import __version__
from mps_health.config import Config
from mps_health.results import CRITICAL, OK, STATE_NAMES, UNKNOWN, WARNING, Report, Result
from nagiosplugin.platform import with_timeout

from .budget import within_budget
from .series import PREFIX, Sample, samples

PROG = "check_mps"
EXIT_UNKNOWN = 3
MAX_OUTPUT = 8192 - 1  # bytes Nagios 4 keeps of a plugin's output (MAX_PLUGIN_OUTPUT_LENGTH)
MAX_STATUS = 600  # bytes of status text before " | ": the rest goes to the long output
MAX_PERFDATA = 4096
DEFAULT_TIMEOUT = 10
_RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}
_NP_STATE = {OK: nagiosplugin.Ok, WARNING: nagiosplugin.Warn, CRITICAL: nagiosplugin.Critical,
             UNKNOWN: nagiosplugin.Unknown}
_UOM = {"seconds": "s", "bytes": "B", "percent": "%"}


# ---- arguments ---------------------------------------------------------------------


class UsageError(Exception):
    """Bad arguments: UNKNOWN (3), never argparse's 2, which Nagios reads as CRITICAL."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _range(text: str) -> str:
    try:
        nagiosplugin.Range(text)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"invalid range {text!r} (forms: 10, 10:, ~:10, 10:20, @10:20)") from None
    return text


def _timeout(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid timeout {text!r}: whole seconds") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"timeout {value} out of range 1..3600")
    return value


def _names(text: str) -> List[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def parser() -> _Parser:
    p = _Parser(prog=PROG, add_help=False, description=(
        "Check NVIDIA MPS on this node: control daemons, pipe dirs, and every check "
        "mps-health runs. Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."),
        epilog="Ranges follow the monitoring-plugins syntax: 10 (alert outside 0..10), "
               "10: (below 10), ~:10 (above 10), 10:20, @10:20 (inside). Latency is in "
               "seconds. The plugin's own timeout is UNKNOWN; a daemon that does not answer "
               "within it is CRITICAL (control-wedged).")
    p.add_argument("-w", "--warning", type=_range, metavar="RANGE",
                   help="control latency warning range in seconds (default: the config's "
                        "control.warn_latency_s, 0.5)")
    p.add_argument("-c", "--critical", type=_range, metavar="RANGE",
                   help="control latency critical range in seconds (default: twice the "
                        "warning threshold, 1)")
    p.add_argument("-t", "--timeout", type=_timeout, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"the plugin's own time limit (default {DEFAULT_TIMEOUT}); the "
                        "checks get a budget below it")
    p.add_argument("--only", type=_names, default=[], metavar="A,B",
                   help="run only these checks (mps-health's names)")
    p.add_argument("--skip", type=_names, default=[], metavar="A,B",
                   help="do not run these checks")
    p.add_argument("--config", metavar="FILE",
                   help="config file (default /etc/mps-health/config.yaml if it exists)")
    p.add_argument("--root", metavar="DIR", default="/", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="long output: -v every result and action, -vv also timings")
    p.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    p.add_argument("-V", "--version", action="store_true", help="show the version and exit")
    return p


# ---- acquisition ---------------------------------------------------------------------


def budget_for(timeout_s: int, config_budget_s: float) -> float:
    """The engine's budget: room inside -t for start-up, judging and printing."""
    return min(config_budget_s, max(0.5, timeout_s * 0.8 - 0.2))


class MpsNode(nagiosplugin.Resource):
    """The node's MPS, as mps-health's engine sees it in one run."""

    def __init__(self, config: Config, only: Sequence[str], skip: Sequence[str],
                 budget_s: float, root: str = "/") -> None:
        self.config, self.only, self.skip = config, list(only), list(skip)
        self.budget_s, self.root = budget_s, root
        self.report: Optional[Report] = None
        self.instance_gpus: Dict[str, str] = {}

    @property
    def name(self) -> str:
        return "MPS"

    def probe(self) -> Iterator[nagiosplugin.Metric]:
        from mps_health import engine

        try:
            facts, report = engine.run(self.config, self.root, self.only, self.skip,
                                       self.budget_s)
        except engine.SelectionError as e:
            raise nagiosplugin.CheckError(str(e)) from None
        self.report = report
        self.instance_gpus = {i.name: i.gpu for i in facts.instances if i.gpu}
        for n, result in enumerate(r for run in report.runs for r in run.results):
            yield nagiosplugin.Metric(f"result{n}", result, context="mps_result")
        for label, sample in perf_labels(samples(report, self.instance_gpus)):
            latency = sample.check == "control" and sample.key == "latency_s"
            low: Optional[float] = 0.0
            high: Optional[float] = {"flag": 1.0, "percent": 100.0}.get(sample.unit)
            if sample.unit in ("", "percent") and sample.value < 0:
                low = None  # a signed number: no known minimum
            yield nagiosplugin.Metric(label, sample.value, _UOM.get(sample.unit, ""),
                                      low, high, context="latency" if latency else "perf")


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


# ---- evaluation ----------------------------------------------------------------------


class ResultContext(nagiosplugin.Context):
    """A check's result keeps the state the check gave it."""

    def evaluate(self, metric: nagiosplugin.Metric, resource: Any) -> nagiosplugin.Result:
        r: Result = metric.value
        return nagiosplugin.Result(_NP_STATE[r.state], r.message, metric)


def _number(v: float) -> str:
    """A perfdata number: plain decimal, never exponent notation (the guidelines' [-0-9.])."""
    if float(v).is_integer():
        return str(int(v))
    return (f"{v:.6f}".rstrip("0").rstrip(".")) or "0"


class PerfContext(nagiosplugin.Context):
    """A number to graph: always OK, perfdata with min and max where known."""

    def performance(self, metric: nagiosplugin.Metric, resource: Any) -> nagiosplugin.Performance:
        return nagiosplugin.Performance(
            metric.name, _number(metric.value), metric.uom or "", "", "",
            "" if metric.min is None else _number(metric.min),
            "" if metric.max is None else _number(metric.max))


class LatencyContext(nagiosplugin.ScalarContext):
    """Control latency against -w/-c, printed as plain decimals."""

    def performance(self, metric: nagiosplugin.Metric, resource: Any) -> nagiosplugin.Performance:
        return nagiosplugin.Performance(
            metric.name, _number(metric.value), metric.uom or "", self.warning, self.critical,
            "" if metric.min is None else _number(metric.min), "")


class RankedResults(nagiosplugin.Results):
    """nagiosplugin ranks UNKNOWN above CRITICAL; mps-health (and Nagios' own max_state_alt)
    rank CRITICAL > WARNING > UNKNOWN > OK: a node with a dead daemon and one unreadable
    fact is broken, not unknown."""

    @property
    def most_significant_state(self) -> nagiosplugin.state.ServiceState:
        return max(self.by_state, key=lambda s: _RANK[int(s)])


# ---- presentation --------------------------------------------------------------------


def _clean(text: str) -> str:
    """One line without '|', which would start perfdata."""
    return " ".join(text.replace("|", "/").split())


class MpsSummary(nagiosplugin.Summary):
    def __init__(self, node: MpsNode) -> None:
        self.node = node

    def ok(self, results: nagiosplugin.Results) -> str:
        report = self.node.report
        if report is None:
            return "no result"
        return (f"{len(report.runs)} checks passed on {report.node} "
                f"in {report.duration_s:.2f}s")

    def problem(self, results: nagiosplugin.Results) -> str:
        found = findings(results)
        if not found:
            return "no result"
        _state, label, message = found[0]
        text = f"{label}: {message}"
        others = list(dict.fromkeys(lbl for _s, lbl, _m in found[1:] if lbl != label))
        if others:
            shown = ", ".join(others[:5]) + (f", +{len(others) - 5} more"
                                             if len(others) > 5 else "")
            text += f"; also {shown}"
        return _clean(text)


def findings(results: nagiosplugin.Results) -> List[Tuple[int, str, str]]:
    """(state, 'code instance', message) of every non-OK result, worst first."""
    out = []
    for r in results.results:
        code = int(r.state)
        if code == OK or r.metric is None:
            continue
        if r.metric.context == "mps_result":
            res: Result = r.metric.value
            out.append((code, res.code + (f" {res.instance}" if res.instance else ""),
                        res.message))
        else:
            out.append((code, f"{r.metric.name}",
                        f"{r.metric.valueunit} {r.hint or ''}".strip()))
    if not out:  # a CheckError (no metric): the engine could not run
        out = [(int(r.state), "check-failed", str(r)) for r in results.results
               if int(r.state) != OK]
    out.sort(key=lambda f: -_RANK[f[0]])
    return out


def long_output(results: nagiosplugin.Results, report: Optional[Report],
                verbose: int) -> List[str]:
    lines = []
    for code, label, message in findings(results):
        action = ""
        for r in results.results:
            if r.metric is not None and r.metric.context == "mps_result" \
                    and r.metric.value.message == message and r.metric.value.action:
                action = f" -> {r.metric.value.action}"
                break
        lines.append(_clean(f"{STATE_NAMES[code]} {label}: {message}{action}"))
    if report is not None:
        for run in report.runs:
            for res in run.results:
                if res.state == OK:
                    where = f"[{res.instance}]" if res.instance else ""
                    lines.append(_clean(f"OK {res.check}{where}: {res.message}"))
        if verbose >= 2:
            spent = ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in sorted(report.gather_s.items()))
            lines.append(f"gathered: {spent or 'nothing'}; total {report.duration_s * 1000:.1f}ms")
    return lines


def render(status: str, perfdata: Sequence[str], long_lines: Sequence[str]) -> str:
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


# ---- the plugin ----------------------------------------------------------------------


def build(config: Config, args: argparse.Namespace) -> Tuple[nagiosplugin.Check, MpsNode]:
    warn = args.warning if args.warning is not None else f"{config.control.warn_latency_s:g}"
    crit = args.critical if args.critical is not None else \
        f"{2 * nagiosplugin.Range(warn).end:g}" if nagiosplugin.Range(warn).end != float("inf") \
        else ""
    # -w/-c judge latency here: switch off the core's own slow-answer warning.
    config = config._replace(control=config.control._replace(warn_latency_s=float("inf")))
    budget = budget_for(args.timeout, config.budget_s)
    node = MpsNode(within_budget(config, budget), args.only, args.skip, budget, args.root)
    check = nagiosplugin.Check(
        node, ResultContext("mps_result"), PerfContext("perf"),
        LatencyContext("latency", warn, crit, fmt_metric="{valueunit}"),
        MpsSummary(node), RankedResults(), name="MPS")
    return check, node


def execute(check: nagiosplugin.Check, timeout_s: int, verbose: int = 0,
            report_of: Optional[MpsNode] = None) -> Tuple[str, int]:
    """Run ``check`` within ``timeout_s`` (SIGALRM, whole seconds): (output, exit code)."""
    try:
        with_timeout(timeout_s, check)
    except nagiosplugin.Timeout:
        return (f"{check.name} UNKNOWN - {PROG} timed out after {timeout_s}s before the "
                "checks finished (raise -t, or look for a hung process on the node)\n",
                EXIT_UNKNOWN)
    state = check.state
    code = int(state)
    status = f"{check.name} {STATE_NAMES[code]} - {check.summary_str}"
    lines: List[str] = []
    if verbose:
        report = report_of.report if report_of is not None else None
        lines = long_output(check.results, report, verbose)
    return render(status, check.perfdata, lines), code


def _version() -> str:
    return f"{PROG} v{__version__} (mps-health {__version__}, nagiosplugin " \
           f"{nagiosplugin.__VERSION__})"


def run(argv: Sequence[str]) -> Tuple[str, int]:
    from mps_health import engine
    from mps_health.config import ConfigError, load

    p = parser()
    try:
        args = p.parse_args(list(argv))
    except UsageError as e:
        return f"MPS UNKNOWN - {_clean(str(e))} (see {PROG} -h)\n", EXIT_UNKNOWN
    if args.help:
        return p.format_help(), EXIT_UNKNOWN
    if args.version:
        return _version() + "\n", EXIT_UNKNOWN
    try:
        config = load(args.config)
        engine.select_checks(config, args.only, args.skip)
    except (ConfigError, engine.SelectionError) as e:
        return f"MPS UNKNOWN - {_clean(str(e))}\n", EXIT_UNKNOWN
    check, node = build(config, args)
    return execute(check, args.timeout, args.verbose, node)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script: print the output, return the Nagios exit code."""
    try:
        text, code = run(sys.argv[1:] if argv is None else argv)
    except Exception as e:  # the edge: one line, UNKNOWN, never a traceback
        import os

        if os.environ.get("MPS_HEALTH_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        text, code = (f"MPS UNKNOWN - internal error: {type(e).__name__}: {_clean(first)} "
                      "(set MPS_HEALTH_DEBUG=1 for a traceback, and report it)\n", EXIT_UNKNOWN)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
