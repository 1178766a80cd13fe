"""A Report's numbers as named, labelled samples: the metric contract (docs/metrics.md).

The Prometheus exporter and the Nagios plugin both read ``Result.values`` through here, so
a check added later shows up in both without code changes:

* value key ``K`` of check ``C`` is ``mps_health_C_K``, or ``mps_health_K`` when ``K``
  starts with ``C`` ('-' read as '_'); ``ALIASES`` renames the few that read badly;
* the key's suffix gives the unit: ``_s`` seconds, ``_bytes`` bytes, ``_percent``/
  ``_percentage`` a percentage, ``_up``/``_ok`` 0-or-1 flags;
* labels: ``mps_instance``, the instance's GPU as ``gpu`` (an index) or ``UUID``
  (dcgm-exporter's names, so the series join), then ``Result.labels``;
* two results giving the same series: the worse state wins (pipe and log dir both
  report ``dir_ok``: 0 if either is bad).

Pure and cheap: no prometheus_client.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from mps_health.model.results import Report, worst

PREFIX = "mps_health_"

# (check, key) -> metric name without the prefix, where the generic rule reads badly.
ALIASES: Dict[Tuple[str, str], str] = {("directories", "dir_ok"): "dir_ok"}

# Names the exporter itself defines: a check's value may never shadow them.
RESERVED = frozenset(PREFIX + n for n in (
    "status", "problem", "build_info", "check_status", "check_success",
    "check_duration_seconds", "source_duration_seconds", "run_duration_seconds",
    "last_run_timestamp_seconds", "last_success_timestamp_seconds", "run_success",
    # the served exporter's own (exporters/http.py)
    "exporter_connections", "exporter_max_connections", "exporter_connections_closed",
    "exporter_connections_closed_total",
))

# Label names Prometheus sets on every target: a sample carrying them would be renamed.
TARGET_LABELS = frozenset(("instance", "job"))

Labels = Tuple[Tuple[str, str], ...]


class Sample(NamedTuple):
    """One number of one result, named for Prometheus and described for perfdata."""

    metric: str  # full Prometheus name, e.g. mps_health_control_latency_seconds
    labels: Labels
    value: float
    check: str
    key: str  # the value key as the check wrote it, e.g. latency_s
    instance: str
    state: int  # the state of the result that carried it
    unit: str  # "seconds", "bytes", "percent", "flag" or ""


def _clean(text: str) -> str:
    """``text`` with every character outside [A-Za-z0-9_] turned into '_'."""
    out = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text)
    return out or "_"


def unit_of(key: str) -> Tuple[str, str]:
    """(base name, unit) of a value key: latency_s -> (latency, seconds)."""
    for suffix, unit in (("_seconds", "seconds"), ("_s", "seconds"), ("_bytes", "bytes")):
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], unit
    if key.endswith(("_percent", "_percentage")):
        return key, "percent"
    if key.endswith(("_up", "_ok")) or key in ("up", "ok"):
        return key, "flag"
    return key, ""


def metric_name(check: str, key: str) -> str:
    """The Prometheus name of value ``key`` of ``check`` (see the module's contract)."""
    alias = ALIASES.get((check, key))
    base, unit = unit_of(key)
    family = _clean(check)  # "compute-mode" and "compute_mode" name the same family
    own = key == family or key.startswith(family + "_")
    stem = alias or (base if own else f"{family}_{base}")
    if unit in ("seconds", "bytes") and not stem.endswith("_" + unit):
        stem += "_" + unit
    name = PREFIX + _clean(stem)
    if name in RESERVED:
        name = PREFIX + "value_" + _clean(stem)
    return name


def label_name(raw: str) -> str:
    """A valid Prometheus label name for ``raw`` (never a target label, never __*)."""
    name = _clean(raw)
    if name[0].isdigit():
        name = "_" + name
    while name.startswith("__"):  # reserved for Prometheus' own use
        name = name[1:]
    if name in TARGET_LABELS:
        name = "exported_" + name
    return name


def labels_of(instance: str, extra: Labels, instance_gpus: Mapping[str, str]) -> Labels:
    labels: Dict[str, str] = {}
    if instance:
        labels["mps_instance"] = instance
        gpu = instance_gpus.get(instance)
        if gpu is not None:  # dcgm-exporter's label: ``gpu`` for an index, ``UUID`` for a UUID
            labels["UUID" if gpu.startswith(("GPU-", "MIG-")) else "gpu"] = gpu
    for raw, value in extra:
        labels[label_name(str(raw))] = str(value)
    return tuple(labels.items())


def samples(report: Report, instance_gpus: Optional[Mapping[str, str]] = None) -> List[Sample]:
    """Every finite value of every result, one sample per series (worst state wins).
    Labels name each instance's GPU from ``instance_gpus``, by default the report's."""
    gpus = report.instance_gpus if instance_gpus is None else instance_gpus
    chosen: Dict[Tuple[str, Labels], Sample] = {}
    for run in report.runs:
        for result in run.results:
            labels = labels_of(result.instance, result.labels, gpus)
            for key, value in result.values:
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    continue  # a check bug must not break every output
                if math.isnan(number):
                    continue
                sample = Sample(metric_name(result.check, key), labels, number, result.check,
                                key, result.instance, result.state, unit_of(key)[1])
                where = (sample.metric, labels)
                held = chosen.get(where)
                if held is None or (worst([held.state, sample.state]) == sample.state
                                    and sample.state != held.state):
                    chosen[where] = sample
    return list(chosen.values())
