"""Facts to JSON and back, driven by the NamedTuples' own type hints (snapshots, replay)."""

from typing import Any, Dict, Tuple, Union, get_type_hints

try:
    from typing import get_args, get_origin
except ImportError:  # pragma: no cover - Python < 3.8 is not supported anyway
    raise


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


def decode(tp: Any, data: Any, where: str = "$") -> Any:
    """``data`` (from JSON) rebuilt as type ``tp``; DecodeError names where it does not fit."""
    if tp is Any or tp is object:
        return data
    origin = get_origin(tp)
    if origin is Union:
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, data, where)
            except DecodeError as e:
                errors.append(str(e))
        raise DecodeError(errors[0] if errors else f"{where}: no type fits")
    if origin in (tuple, Tuple):
        args = get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(f"{where}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        return tuple(decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if origin in (dict, Dict) or (origin is not None and getattr(origin, "__name__", "") in
                                  ("Mapping",)):
        _key_t, val_t = get_args(tp) or (str, Any)
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected a mapping")
        return {k: decode(val_t, v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected a mapping for {tp.__name__}")
        hints = get_type_hints(tp)
        kwargs = {}
        for field in tp._fields:
            if field in data:
                kwargs[field] = decode(hints.get(field, Any), data[field], f"{where}.{field}")
            elif field not in getattr(tp, "_field_defaults", {}):
                raise DecodeError(f"{where}: {tp.__name__} lacks '{field}'")
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise DecodeError(f"{where}: expected a number")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise DecodeError(f"{where}: expected {tp.__name__}")
        return data
    return data
