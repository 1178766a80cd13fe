"""``typing.NamedTuple`` at run time, without importing ``typing``.

The fast path (``mps-health check``, ``check_mps``) builds some forty frozen records at
import. ``typing`` costs milliseconds to import and ``typing.NamedTuple`` more per class
than ``collections.namedtuple``, which is what it calls in the end. Modules write::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple  # what mypy and readers see
    else:
        from mps_health.frozen import NamedTuple

and declare records exactly as for typing (annotated fields, defaults, methods,
properties, a docstring); annotations stay text (``from __future__ import
annotations``), which ``codec`` reads for snapshots and state.
"""

from collections import namedtuple

# Class-body names that are not methods to copy onto the record.
_SKIP = frozenset(("__module__", "__qualname__", "__annotations__", "__slots__",
                   "__orig_bases__", "__classcell__"))


class _Maker(type):
    def __new__(mcls, name: str, bases: tuple, ns: dict):
        if ns.get("_is_root"):
            return super().__new__(mcls, name, bases, ns)
        annotations = dict(ns.get("__annotations__", {}))
        fields = list(annotations)
        defaults = [ns[f] for f in fields if f in ns]
        if any(f not in ns for f in fields[len(fields) - len(defaults):]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        cls = namedtuple(name, fields, defaults=defaults,  # type: ignore[misc]
                         module=ns.get("__module__"))
        cls.__annotations__ = annotations
        cls.__qualname__ = ns.get("__qualname__", name)
        for key, value in ns.items():
            if key not in _SKIP and key not in annotations:
                setattr(cls, key, value)
        return cls


class NamedTuple(metaclass=_Maker):
    """Base of a frozen record: subclasses become ``collections.namedtuple`` classes."""

    _is_root = True


class Generic:
    """``typing.Generic`` at run time: only mypy reads the parameters."""

    def __class_getitem__(cls, _params: object) -> type:
        return cls


def TypeVar(name: str, *_constraints: object, **_options: object) -> str:
    """``typing.TypeVar`` at run time: only mypy reads it."""
    return name
