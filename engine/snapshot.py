"""Snapshots: the gathered facts as JSON, to judge later (support bundles, replay).

A snapshot may come from anyone: ``read`` takes a regular file only, not through a
symlink, of at most MAX_BYTES; nesting past ``inputs.MAX_DEPTH`` is refused; error lines
quote cut values. Replay judges at most ``mps.max_instances`` instances, as a live run.
"""

import json
import typing
from typing import Any, Dict, Mapping, Tuple

from mps_health import __version__
from mps_health.engine import registry
from mps_health.model import codec
from mps_health.model.facts import Facts
from mps_health.model.printable import escape

FORMAT = "mps-health-snapshot"
FORMAT_VERSION = 1
# About 2 KB a per-job instance: the largest mps.max_instances (100000) fits.
MAX_BYTES = 256 << 20


# What a snapshot may leave out of the Facts fields besides sources (node and taken_at
# it must give), and what that means; each field is decoded as Facts declares it.
ABSENT: Dict[str, Any] = {"root": "/", "instances": [], "errors": {}, "durations": {},
                          "instances_over_cap": 0, "unjudged": []}


class SnapshotError(ValueError):
    pass


def dumps(facts: Facts, config_raw: Mapping[str, Any]) -> str:
    return json.dumps({**codec.encode(facts), "format": FORMAT,
                       "format_version": FORMAT_VERSION, "mps_health_version": __version__,
                       "config": dict(config_raw)}, indent=1, sort_keys=True)


def capped(facts: Facts, cap: int) -> Facts:
    """``facts`` with at most ``cap`` instances, the rest counted as not judged, as a live
    run gathers them."""
    over = len(facts.instances) - cap
    if over <= 0:
        return facts
    return facts._replace(instances=facts.instances[:cap],
                          instances_over_cap=facts.instances_over_cap + over)


def read(path: str) -> Tuple[Facts, Dict[str, Any]]:
    """The snapshot at ``path``, as ``loads`` gives it; SnapshotError (naming the file)
    if it cannot be read or used."""
    from mps_health.config.inputs import InputError, read_text

    try:
        text = read_text(path, MAX_BYTES)
    except InputError as e:
        raise SnapshotError(f"{path}: {e}") from None
    if text is None:
        raise SnapshotError(f"{path}: no such file")
    return loads(text, path)


def loads(text: str, where: str) -> Tuple[Facts, Dict[str, Any]]:
    """(facts, the config mapping they were taken with); SnapshotError on bad input."""
    from mps_health.config.inputs import MAX_DEPTH, InputError, tree_size
    from mps_health.config.schema import shown

    try:
        data = json.loads(text)
    except RecursionError:
        raise SnapshotError(f"{where}: nested too deeply (mps-health writes fewer than "
                            f"{MAX_DEPTH} levels)") from None
    except ValueError as e:
        raise SnapshotError(f"{where}: not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{where}: not an mps-health snapshot (no format '{FORMAT}')")
    if data.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{where}: snapshot format {shown(data.get('format_version'))} "
                            f"is not supported (this version reads {FORMAT_VERSION})")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise SnapshotError(f"{where}: 'config' must be a mapping")
    try:
        tree_size(config)
    except InputError as e:
        raise SnapshotError(f"{where}: its config {e}") from None
    try:
        sources: Dict[str, object] = {}
        for name, value in (data.get("sources") or {}).items():
            src = registry.SOURCES.get(name)
            if src is None:
                continue  # a source this version does not know: ignore it
            sources[name] = codec.decode(src.probe().value_type, value, f"sources.{name}")
        types = typing.get_type_hints(Facts)
        facts = Facts(sources=sources, **{
            key: codec.decode(types[key], data.get(key, ABSENT.get(key)), key)
            for key in Facts._fields if key != "sources"})
    except codec.DecodeError as e:  # it names keys from the file: quoted, cut
        raise SnapshotError(f"{where}: {escape(str(e), 300)}") from None
    return facts, config
