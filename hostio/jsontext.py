"""JSON text for the state files, without importing ``json``.

``import json`` imports ``re``, and with it ``enum``, ``functools`` and ``collections``:
about two thirds of a bare ``python3 -c pass``, paid on every check for two small state
files. ``json`` does its work in the C accelerator ``_json`` (CPython's, built in since
3.1; the same calls through 3.14) and only wraps it; here it is called directly. The
text is ``json``'s: ``dumps`` writes what ``json.dumps(value, sort_keys=True)`` writes,
``loads`` accepts what ``json.loads`` accepts (tests/unit/test_jsontext.py compares
them). An interpreter without ``_json`` uses ``json``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Tuple

_SPACE = " \t\n\r"  # JSON's whitespace, all of it


def _unencodable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Options:
    """What ``_json.make_scanner`` reads from ``json.JSONDecoder``: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity, as json reads them


def _accelerator() -> Any:
    try:
        import _json
    except ImportError:  # not CPython
        return None
    return _json


_ACCEL = _accelerator()

if _ACCEL is not None:
    _scan: Callable[[str, int], Tuple[Any, int]] = _ACCEL.make_scanner(_Options)

    def dumps(value: Any) -> str:
        """``value`` as ``json.dumps(value, sort_keys=True)`` writes it."""
        # (markers for cycles, default, string encoder, indent, key and item separators,
        # sort_keys, skipkeys, allow_nan), as json.dumps passes them; a new encoder per
        # call, as json makes one: a failed call leaves its markers behind.
        encode = _ACCEL.make_encoder({}, _unencodable, _ACCEL.encode_basestring_ascii, None,
                                     ": ", ", ", True, False, True)
        return "".join(encode(value, 0))

    def loads(text: str) -> Any:
        """The value ``text`` holds; ValueError (as json raises) if it is not JSON."""
        start = len(text) - len(text.lstrip(_SPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration as e:  # no value at all where one must start
            raise ValueError(f"Expecting value: char {e.value}") from None
        if text[end:].strip(_SPACE):
            raise ValueError(f"Extra data: char {end}")
        return value

else:
    def dumps(value: Any) -> str:
        import json

        return json.dumps(value, sort_keys=True)

    def loads(text: str) -> Any:
        import json

        return json.loads(text)
