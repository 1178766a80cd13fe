"""Facts to JSON and back, driven by the records' field types (snapshots, replay, the
deep checks' state between runs).

Types are type objects, taken apart with ``typing.get_origin``/``get_args``; a record's
field types come from ``typing.get_type_hints``, which resolves a record module's
``from __future__ import annotations`` text in that module's globals (every name a field
names is imported there at run time). The forms facts use: int, float, str, bool,
Any/object, None, Optional/Union, Tuple[X, ...], Tuple[A, B], Dict/Mapping, List/Sequence
and records (NamedTuples).
"""

import collections.abc
import typing
from typing import Any, Dict, List, Tuple

Node = Tuple[Any, ...]


class DecodeError(ValueError):
    pass


def encode(value: Any) -> Any:
    """A NamedTuple tree as plain JSON-able data."""
    if hasattr(value, "_asdict"):
        return {k: encode(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


_ANY: Node = ("any",)
_NONE = type(None)


def parse(tp: Any) -> Node:
    """The decoding plan for type ``tp``."""
    if tp is Any or tp is object:
        return _ANY
    if tp is None or tp is _NONE:
        return ("none",)
    if isinstance(tp, type) and hasattr(tp, "_fields"):
        return ("record", tp)
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)  # tuple: (tuple, ())
    if origin is typing.Union:
        return ("union", [parse(a) for a in args if a is not _NONE], _NONE in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return ("tuple", [parse(a) for a in args])
    if origin in (tuple, list, collections.abc.Sequence):
        return ("varlen", parse(args[0]) if args else _ANY)
    if origin in (dict, collections.abc.Mapping):
        return ("dict", parse(args[1]) if args else _ANY)
    if isinstance(tp, type):
        return ("leaf", tp)
    raise DecodeError(f"cannot decode values of type {tp!r}")


_FIELDS: Dict[type, List[Tuple[str, Node]]] = {}


def _fields_of(cls: type) -> List[Tuple[str, Node]]:
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = [(f, parse(hints[f]) if f in hints else _ANY)
                        for f in cls._fields]  # type: ignore[attr-defined]
    return _FIELDS[cls]


def decode(tp: Any, data: Any, where: str = "$") -> Any:
    """``data`` (from JSON) rebuilt as type ``tp``; DecodeError names where it does not fit."""
    return _decode(parse(tp), data, where)


def _decode(node: Node, data: Any, where: str) -> Any:
    kind = node[0]
    if kind == "any":
        return data
    if kind == "none":
        if data is not None:
            raise DecodeError(f"{where}: expected null")
        return None
    if kind == "union":
        if data is None and node[2]:
            return None
        errors = []
        for arg in node[1]:
            try:
                return _decode(arg, data, where)
            except DecodeError as e:
                errors.append(str(e))
        raise DecodeError(errors[0] if errors else f"{where}: no type fits")
    if kind in ("varlen", "tuple"):
        if not isinstance(data, list):
            raise DecodeError(f"{where}: expected a list")
        if kind == "varlen":
            return tuple(_decode(node[1], v, f"{where}[{i}]") for i, v in enumerate(data))
        return tuple(_decode(a, v, f"{where}[{i}]")
                     for i, (a, v) in enumerate(zip(node[1], data)))
    if kind == "dict":
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected a mapping")
        return {k: _decode(node[1], v, f"{where}.{k}") for k, v in data.items()}
    if kind == "record":
        cls = node[1]
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected a mapping for {cls.__name__}")
        kwargs = {}
        for field, sub in _fields_of(cls):
            if field in data:
                kwargs[field] = _decode(sub, data[field], f"{where}.{field}")
            elif field not in getattr(cls, "_field_defaults", {}):
                raise DecodeError(f"{where}: {cls.__name__} lacks '{field}'")
        return cls(**kwargs)
    tp = node[1]
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise DecodeError(f"{where}: expected a number")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise DecodeError(f"{where}: expected {tp.__name__}")
        return data
    return data
