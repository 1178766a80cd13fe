"""How a config section is declared: a frozen record whose fields are key specs.

``class LogsConfig(Record): window_s: float = number(900.0, low=0.001)``, then
``SECTIONS = (Section("logs", LogsConfig),)``: ``mps_health.config.load`` validates the
whole file against every declared section; callers read ``config.get(SECTION)``. A
spec's ``parse`` turns one YAML value into the field's value or raises ``Invalid``; the
loader adds the file and the key. No heavy import here: this runs on every check.
"""

from __future__ import annotations

import os.path
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, Callable, ClassVar, Generic, NamedTuple, Optional, TypeVar

SHOWN_MAX = 60  # characters of a bad value quoted back in an error line


class Invalid(ValueError):
    """One bad value: ``why`` it is wrong, and the sub-key under the field, if any."""

    def __init__(self, why: str, key: str = "") -> None:
        super().__init__(why)
        self.why, self.key = why, key


def shown(value: Any) -> str:
    """A value for an error line: escaped (repr) and cut to SHOWN_MAX characters. By
    ``reprlib``, which stops after a few items and levels: a full repr of what YAML aliases
    repeat (or of a cycle) would be as large as its expansion, however small the file."""
    short = reprlib.Repr()
    # reprlib cuts strings in their middle: far enough out that the cut below is the one seen.
    short.maxlevel, short.maxstring, short.maxother = 3, 4 * SHOWN_MAX, 4 * SHOWN_MAX
    text = short.repr(value)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX - 3] + "..."


def has_control(text: str) -> bool:
    """True for C0/C1 control characters (newline, ESC, DEL...): never in a path or command."""
    return any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in text)


class Spec(NamedTuple):
    """One key: its default and the function that checks and converts a given value."""

    default: Any
    parse: Callable[[Any], Any]


R = TypeVar("R", bound="Record")


class Record:
    """A frozen settings record. Fields are the class attributes given as specs."""

    _specs: ClassVar[dict[str, Spec]] = {}
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls) -> None:
        specs = dict(cls._specs)
        for name, value in list(vars(cls).items()):
            if isinstance(value, Spec):
                specs[name] = value
                setattr(cls, name, value.default)
        cls._specs = specs
        cls._fields = tuple(specs)

    def __init__(self, **values: Any) -> None:
        for name in values:
            if name not in self._specs:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
        for name, spec in self._specs.items():
            object.__setattr__(self, name, values.get(name, spec.default))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: use _replace")

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._asdict() == other._asdict()

    def __hash__(self) -> int:
        return hash(tuple(repr(v) for v in self._asdict().values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._asdict().items())
        return f"{type(self).__name__}({inner})"


# finish(record, given, loaded) -> record: rules across keys or sections. ``given`` is the
# section as written, ``loaded`` the sections validated before this one (by name).
Finish = Callable[[Any, Mapping[str, Any], Mapping[str, Record]], Any]


class Section(Generic[R]):
    """A top-level config key holding a mapping, validated into ``record``."""

    def __init__(self, name: str, record: type[R], finish: Optional[Finish] = None) -> None:
        self.name, self.record, self.finish = name, record, finish

    def of(self, config: Any) -> R:
        """``config.get(self)``: this section's record in a loaded Config."""
        return config.get(self)

    def validate(self, given: Mapping[str, Any], loaded: Mapping[str, Record]) -> R:
        """The record for ``given``; Invalid(why, key) names the first bad key."""
        specs = self.record._specs
        for key in given:
            if key not in specs:
                raise Invalid(f"unknown key (known here: {', '.join(self.record._fields)})",
                              str(key))
        values = {}
        for key, value in given.items():
            try:
                values[key] = specs[key].parse(value)
            except Invalid as e:
                raise Invalid(e.why, f"{key}.{e.key}" if e.key else key) from None
        record = self.record(**values)
        return self.finish(record, given, loaded) if self.finish else record


# --- specs ------------------------------------------------------------------------------

def user_name(value: Any) -> str:
    """A user name or uid (a uid as its digits); "" is taken too."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if not isinstance(value, str) or has_control(value) or any(c.isspace() for c in value):
        raise Invalid(f"must be a user name or uid (got {shown(value)})")
    return value


def custom(default: Any, parse: Callable[[Any], Any], optional: bool = False) -> Any:
    """A key ``parse`` checks and converts; with ``optional``, null is taken too (None)."""
    return Spec(default, (lambda v: None if v is None else parse(v)) if optional else parse)


def number(default: Optional[float], low: float = 0.0, high: float = float("inf"),
           optional: bool = False) -> Any:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not low <= value <= high:
            bounds = f"between {low:g} and {high:g}" if high != float("inf") else f">= {low:g}"
            raise Invalid(f"must be a number {bounds} (got {shown(value)})")
        return float(value)
    return custom(default, parse, optional)


def whole(default: Optional[int], low: int = 0, high: int = 2**63, optional: bool = False
          ) -> Any:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Invalid(f"must be a whole number from {low} to {high} (got {shown(value)})")
        return value
    return custom(default, parse, optional)


def flag(default: Optional[bool], optional: bool = False) -> Any:
    def parse(value: Any) -> bool:
        if not isinstance(value, bool):
            raise Invalid(f"must be true{', false or null' if optional else ' or false'} "
                          f"(got {shown(value)})")
        return value
    return custom(default, parse, optional)


def text(default: Optional[str], choices: Sequence[str] = (), optional: bool = False) -> Any:
    """A non-empty string without control characters, one of ``choices`` if given."""
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not value.strip() or has_control(value):
            raise Invalid(f"must be a non-empty string without control characters "
                          f"(got {shown(value)})")
        if choices and value not in choices:
            raise Invalid(f"must be one of {', '.join(choices)} (got {shown(value)})")
        return value
    return custom(default, parse, optional)


def abspath(value: Any) -> str:
    """An absolute path without control characters, normalised."""
    if not isinstance(value, str) or not value.startswith("/") or has_control(value):
        raise Invalid(f"must be an absolute path without control characters "
                      f"(got {shown(value)})")
    return os.path.normpath(value)


def pathname(default: Optional[str], optional: bool = False) -> Any:
    return custom(default, abspath, optional)


def command(value: Any) -> str:
    """A program name (found on PATH) or an absolute path, without control characters."""
    if not isinstance(value, str) or not value.strip() or has_control(value) or \
            ("/" in value and not value.startswith("/")):
        raise Invalid(f"must be a program name or an absolute path (got {shown(value)})")
    return value


def octal_mode(value: Any) -> int:
    """A file mode: an octal string ('0777'), or a number YAML read; 0 to 0o7777."""
    try:
        mode = int(value, 8) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        mode = -1
    if isinstance(value, bool) or not 0 <= mode <= 0o7777:
        raise Invalid(f"must be an octal mode as a string, e.g. '0777' (got {shown(value)})")
    return mode


def names(value: Any) -> tuple[str, ...]:
    """A list of names (a single name is a list of one)."""
    if isinstance(value, str):
        value = [value]
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
            isinstance(n, str) and n and not has_control(n) for n in value):
        raise Invalid(f"must be a list of names (got {shown(value)})")
    return tuple(value)


def internal(default: Any) -> Any:
    """A field the loader fills in itself; no file key reaches it."""
    def parse(value: Any) -> Any:
        raise Invalid("is not a config key")
    return Spec(default, parse)


def gpu_ids(value: Any, all_ok: bool = False) -> Optional[tuple[str, ...]]:
    """GPU indices or UUIDs (one alone is a list of one). ``all_ok`` (gpu.mps_gpus): all or
    null is None, [] is taken; else none holds '/', '{' or '}' (they fill dir templates)."""
    if all_ok and (value is None or value == "all"):
        return None
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not (value or all_ok) or not all(
            isinstance(g, (int, str)) and not isinstance(g, bool) and str(g).strip()
            and (all_ok or not any(c in str(g) for c in "/{}")) and str(g).isprintable()
            for g in value):
        raise Invalid(f"must be {'all or ' if all_ok else ''}a list of GPU indices or UUIDs, "
                      f"e.g. [0, 1] (got {shown(value)})")
    return tuple(str(g).strip() for g in value)
