"""Facts to JSON and back, driven by the records' field annotations (snapshots, replay,
the deep checks' state between runs).

Annotations are read as text (``from __future__ import annotations``; NamedTuple keeps a
``ForwardRef``; other ``typing`` objects are turned into text) for the forms facts use:
int, float, str, bool, Any/object, None, Optional, Union, Tuple[X, ...], Tuple[A, B],
Dict/Mapping, List and records (NamedTuples) named as their defining module names them.
"""

from __future__ import annotations

import sys
import typing
from typing import Any, Dict, List, Mapping, Optional, Tuple

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


_LEAVES = {"int": int, "float": float, "str": str, "bool": bool}
_ANY: Node = ("any",)


def split_top_level(text: str) -> List[str]:
    """The comma-separated parts of ``text`` outside brackets, stripped, empty ones dropped."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _typing_text(tp: Any) -> str:
    """A class or ``typing`` object that is no ``_GENERICS`` generic as annotation
    text; a generic of another kind is named without its arguments, and fails as before."""
    if isinstance(tp, typing.ForwardRef):
        return str(tp.__forward_arg__)
    if tp is type(None):
        return "None"
    return "Any" if tp is typing.Any else getattr(tp, "__name__", "Any")


_GENERICS = frozenset(("Optional", "Union", "Tuple", "tuple", "Dict", "dict", "Mapping",
                       "List", "list", "Sequence"))


def _generic(head: str, args: List[Node], varlen: bool) -> Node:
    """The plan of a ``_GENERICS`` head over its arguments' plans (``varlen``: X, ...)."""
    if head in ("Optional", "Union"):
        return ("union", [a for a in args if a != ("none",)],
                head == "Optional" or ("none",) in args)
    if head in ("Tuple", "tuple"):
        return ("varlen", args[0]) if varlen else ("tuple", args)
    if head in ("Dict", "dict", "Mapping"):
        return ("dict", args[1] if len(args) == 2 else _ANY)
    return ("varlen", args[0] if args else _ANY)  # List, Sequence


def parse(tp: Any, ns: Mapping[str, Any]) -> Node:
    """The decoding plan for annotation ``tp`` (text, class or typing object); names are
    looked up in ``ns`` (the globals of the module that wrote the annotation)."""
    if not isinstance(tp, str):
        if isinstance(tp, type) and tp.__name__ not in _LEAVES and tp is not type(None):
            return ("record", tp) if hasattr(tp, "_fields") else ("leaf", tp)
        # A generic typing object (Dict[str, ServerMemory]) keeps its classes: as text
        # their names would have to be found in ``ns``.
        origin, params = typing.get_origin(tp), typing.get_args(tp)
        head = "Union" if origin is typing.Union else getattr(origin, "__name__", "")
        if params and head in _GENERICS:
            return _generic(head, [parse(a, ns) for a in params], params[-1] is Ellipsis)
        tp = _typing_text(tp)
    text = tp.strip().strip("'\"")
    if text == "...":
        return _ANY
    head, bracket, rest = text.partition("[")
    head = head.strip().rsplit(".", 1)[-1]  # typing.Optional, t.Dict
    parts = split_top_level(rest[:-1]) if bracket else []
    args = [parse(a, ns) for a in parts]
    if head in _GENERICS:
        return _generic(head, args, parts[-1:] == ["..."])
    if head in ("None", "NoneType"):
        return ("none",)
    if head in _LEAVES:
        return ("leaf", _LEAVES[head])
    if head in ("Any", "object"):
        return _ANY
    found = ns.get(head)
    if isinstance(found, type) and hasattr(found, "_fields"):
        return ("record", found)
    raise DecodeError(f"cannot decode values of type {text!r}")


_FIELDS: Dict[type, List[Tuple[str, Node]]] = {}


def _fields_of(cls: type) -> List[Tuple[str, Node]]:
    if cls not in _FIELDS:
        ns = vars(sys.modules[cls.__module__])
        hints = getattr(cls, "__annotations__", {})
        _FIELDS[cls] = [(f, parse(hints[f], ns) if f in hints else _ANY)
                        for f in cls._fields]  # type: ignore[attr-defined]
    return _FIELDS[cls]


def decode(tp: Any, data: Any, where: str = "$",
           ns: Optional[Mapping[str, Any]] = None) -> Any:
    """``data`` (from JSON) rebuilt as type ``tp``; DecodeError names where it does not fit.
    ``tp`` is annotation text (names resolved in ``ns``), a class or a typing object."""
    return _decode(parse(tp, ns or {}), data, where)


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
