"""Snapshots: the gathered facts as JSON, to judge later (support bundles, replay)."""

import importlib
import json
from typing import Any, Dict, Mapping, Tuple

from . import __version__, codec, registry
from .facts import Facts, Instance

FORMAT = "mps-health-snapshot"
FORMAT_VERSION = 1


class SnapshotError(ValueError):
    pass


def dumps(facts: Facts, config_raw: Mapping[str, Any]) -> str:
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "mps_health_version": __version__,
        "node": facts.node,
        "taken_at": facts.taken_at,
        "root": facts.root,
        "instances": codec.encode(facts.instances),
        "sources": {name: codec.encode(value) for name, value in facts.sources.items()},
        "errors": dict(facts.errors),
        "durations": dict(facts.durations),
        "instances_over_cap": facts.instances_over_cap,
        "unjudged": codec.encode(facts.unjudged),
        "config": dict(config_raw),
    }
    return json.dumps(data, indent=1, sort_keys=True)


def loads(text: str, where: str) -> Tuple[Facts, Dict[str, Any]]:
    """(facts, the config mapping they were taken with); SnapshotError on bad input."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SnapshotError(f"{where}: not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{where}: not an mps-health snapshot (no format '{FORMAT}')")
    if data.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{where}: snapshot format {data.get('format_version')} is not "
                            f"supported (this version reads {FORMAT_VERSION})")
    try:
        sources: Dict[str, object] = {}
        for name, value in (data.get("sources") or {}).items():
            src = registry.SOURCES.get(name)
            if src is None:
                continue  # a source this version does not know: ignore it
            module, _, attr = src.value_type.partition(":")
            names = vars(importlib.import_module(module))
            sources[name] = codec.decode(names[attr], value, f"sources.{name}", names)
        facts = Facts(
            node=codec.decode(str, data.get("node"), "node"),
            taken_at=codec.decode(float, data.get("taken_at"), "taken_at"),
            root=codec.decode(str, data.get("root", "/"), "root"),
            instances=codec.decode("Tuple[Instance, ...]", data.get("instances", []),
                                   "instances", {"Instance": Instance}),
            sources=sources,
            errors=codec.decode("Dict[str, str]", data.get("errors", {}), "errors"),
            durations=codec.decode("Dict[str, float]", data.get("durations", {}), "durations"),
            instances_over_cap=codec.decode(int, data.get("instances_over_cap", 0),
                                            "instances_over_cap"),
            unjudged=codec.decode("Tuple[Tuple[str, str], ...]", data.get("unjudged", []),
                                  "unjudged"),
        )
    except codec.DecodeError as e:
        raise SnapshotError(f"{where}: {e}") from None
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise SnapshotError(f"{where}: 'config' must be a mapping")
    return facts, config
