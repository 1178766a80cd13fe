"""``typing.NamedTuple`` at run time, without importing ``typing``.

The fast path (``mps-health check``, ``check_mps``) builds some forty frozen records at
import. ``typing`` costs milliseconds to import, and ``typing.NamedTuple`` and
``collections.namedtuple`` compile a ``__new__`` from source for every class (about
0.1 ms each here, 4 ms a check). Modules write::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple  # what mypy and readers see
    else:
        from mps_health.model.frozen import NamedTuple

and declare records exactly as for typing (annotated fields, defaults, methods,
properties, a docstring); annotations stay text (``from __future__ import
annotations``), which ``codec`` reads for snapshots and state.

A record here is a tuple subclass that behaves as a namedtuple does (``_fields``,
``_field_defaults``, ``_make``, ``_replace``, ``_asdict``, keyword arguments, defaults,
repr, pickling, the same TypeErrors): its methods are written once, in ``_Record``, so
making a class compiles nothing. tests/unit/test_frozen.py compares it with
``typing.NamedTuple``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Dict, Tuple

try:
    from _collections import _tuplegetter  # the C field accessor namedtuple uses
except ImportError:  # another Python implementation
    from operator import itemgetter

    def _tuplegetter(index: int, doc: str) -> property:
        return property(itemgetter(index), doc=doc)

_tuple_new = tuple.__new__

def _bind(cls: type, args: tuple, kwargs: dict) -> tuple:
    """The field values of ``cls(*args, **kwargs)``, with namedtuple's TypeErrors."""
    fields = cls._fields  # type: ignore[attr-defined]
    if len(args) > len(fields):
        raise TypeError(f"{cls.__name__}.__new__() takes {len(fields) + 1} positional "
                        f"arguments but {len(args) + 1} were given")
    for name in fields[:len(args)]:
        if name in kwargs:
            raise TypeError(f"{cls.__name__}.__new__() got multiple values for argument "
                            f"'{name}'")
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    values = list(args)
    missing = []
    for name in fields[len(args):]:
        if name in kwargs:
            values.append(kwargs.pop(name))
        elif name in defaults:
            values.append(defaults[name])
        else:
            missing.append(name)
    if kwargs:
        raise TypeError(f"{cls.__name__}.__new__() got an unexpected keyword argument "
                        f"'{next(iter(kwargs))}'")
    if missing:
        names = ", ".join(repr(n) for n in missing)
        raise TypeError(f"{cls.__name__}.__new__() missing {len(missing)} required "
                        f"argument{'s' if len(missing) > 1 else ''}: {names}")
    return tuple(values)


class _Record(tuple):
    """What every record shares (namedtuple writes these anew for each class)."""

    __slots__ = ()
    _fields: ClassVar[Tuple[str, ...]] = ()
    _field_defaults: ClassVar[Dict[str, Any]] = {}

    def __new__(cls, *args, **kwargs):
        if kwargs or len(args) != len(cls._fields):
            args = _bind(cls, args, kwargs)
        return _tuple_new(cls, args)

    @classmethod
    def _make(cls, iterable):
        result = _tuple_new(cls, iterable)
        if len(result) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
        return result

    def _replace(self, /, **kwds):
        result = self._make(map(kwds.pop, self._fields, self))
        if kwds:
            raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
        return result

    def __repr__(self) -> str:
        return type(self).__name__ + "(" + ", ".join(
            f"{name}={value!r}" for name, value in zip(self._fields, self)) + ")"

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self))

    def __getnewargs__(self) -> tuple:
        return tuple(self)


# The field accessors, shared: _tuplegetter(index, doc) holds nothing of its class, and a
# record module builds some forty records at import.
_GETTERS = [_tuplegetter(i, f"Alias for field number {i}") for i in range(16)]


class _Maker(type):
    def __new__(mcls, name: str, bases: tuple, ns: dict):
        if "_is_root" in ns:
            return super().__new__(mcls, name, bases, ns)
        annotations = ns.get("__annotations__", {})
        fields = tuple(annotations)
        defaults = {}
        for index, field in enumerate(fields):
            if field in ns:
                defaults[field] = ns[field]
            elif defaults:
                raise TypeError(f"{name}: a field without a default follows one with a "
                                "default")
            while index >= len(_GETTERS):
                _GETTERS.append(_tuplegetter(len(_GETTERS),
                                             f"Alias for field number {len(_GETTERS)}"))
            ns[field] = _GETTERS[index]
        ns.pop("__slots__", None)
        ns.pop("__orig_bases__", None)
        if "__doc__" not in ns:
            ns["__doc__"] = f"{name}({', '.join(fields)})"
        ns.update(__slots__=(), _fields=fields, _field_defaults=defaults,
                  __match_args__=fields, __annotations__=dict(annotations))
        return type(name, (_Record,), ns)


class NamedTuple(metaclass=_Maker):
    """Base of a frozen record: subclasses become namedtuple-like ``tuple`` classes."""

    _is_root = True


class Generic:
    """``typing.Generic`` at run time: only mypy reads the parameters."""

    def __class_getitem__(cls, _params: object) -> type:
        return cls


def TypeVar(name: str, *_constraints: object, **_options: object) -> str:
    """``typing.TypeVar`` at run time: only mypy reads it."""
    return name
