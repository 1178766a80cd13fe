"""frozen.NamedTuple behaves as typing.NamedTuple does, for every use records get."""

from __future__ import annotations

import copy
import pickle
import typing
from typing import Any, Callable, Optional, Tuple

import pytest
from mps_health.model import frozen


class Typed(typing.NamedTuple):
    """A record with methods."""

    pid: int
    name: str
    tags: Tuple[str, ...] = ()
    parent: Optional[int] = None

    def label(self) -> str:
        return f"{self.name}[{self.pid}]"

    @property
    def root(self) -> bool:
        return self.parent is None


class Ours(frozen.NamedTuple):  # type: ignore[misc]
    """A record with methods."""

    pid: int
    name: str
    tags: Tuple[str, ...] = ()
    parent: Optional[int] = None

    def label(self) -> str:
        return f"{self.name}[{self.pid}]"

    @property
    def root(self) -> bool:
        return self.parent is None


class Bare(frozen.NamedTuple):  # type: ignore[misc]
    a: int


class TypedBare(typing.NamedTuple):
    a: int

CALLS: list[Tuple[str, Callable[[Any], Any]]] = [
    ("positional", lambda cls: cls(1, "a")),
    ("all positional", lambda cls: cls(1, "a", ("x",), 7)),
    ("keywords", lambda cls: cls(name="a", pid=1, parent=3)),
    ("mixed", lambda cls: cls(1, "a", parent=2)),
    ("missing one", lambda cls: cls(1)),
    ("missing two", lambda cls: cls()),
    ("too many", lambda cls: cls(1, "a", (), 2, 3)),
    ("twice", lambda cls: cls(1, "a", pid=2)),
    ("unknown keyword", lambda cls: cls(1, "a", colour=2)),
    ("_make", lambda cls: cls._make([1, "a", (), None])),
    ("_make short", lambda cls: cls._make([1])),
    ("_replace", lambda cls: cls(1, "a")._replace(name="b", tags=("t",))),
    ("_replace unknown", lambda cls: cls(1, "a")._replace(colour=1)),
    ("_asdict", lambda cls: cls(1, "a")._asdict()),
    ("fields", lambda cls: (cls._fields, cls._field_defaults, cls.__match_args__)),
    ("methods", lambda cls: (cls(1, "a").label(), cls(1, "a").root, cls(1, "a", (), 2).root)),
    ("attributes", lambda cls: [cls(1, "a", ("t",), 4).pid, cls(1, "a", ("t",), 4).tags]),
    ("tuple", lambda cls: (tuple(cls(1, "a")), cls(1, "a") == (1, "a", (), None),
                           hash(cls(1, "a")) == hash((1, "a", (), None)), len(cls(1, "a")))),
    ("unpack", lambda cls: [*cls(1, "a")]),
    ("index", lambda cls: cls(1, "a")[1]),
    ("frozen", lambda cls: setattr(cls(1, "a"), "pid", 2)),
    ("no dict", lambda cls: hasattr(cls(1, "a"), "__dict__")),
    ("copy", lambda cls: copy.deepcopy(cls(1, "a", ("t",)))),
    ("doc", lambda cls: cls.__doc__),
]


def outcome(fn: Callable[[Any], Any], cls: type) -> Any:
    try:
        value = fn(cls)
    except Exception as e:
        return type(e).__name__
    if isinstance(value, tuple) and type(value) is cls:
        return (cls.__name__, repr(value).replace(cls.__name__, "R"), tuple(value))
    if isinstance(value, dict):
        return dict(value)
    return value


@pytest.mark.parametrize("what,fn", CALLS, ids=[c[0] for c in CALLS])
def test_same_as_typing(what: str, fn: Callable[[Any], Any]) -> None:
    ours, typed = outcome(fn, Ours), outcome(fn, Typed)
    if isinstance(ours, tuple) and ours and ours[0] == "Ours":
        ours = ours[1:]
        typed = typed[1:]
    assert ours == typed


def test_type_errors_say_what_is_wrong() -> None:
    with pytest.raises(TypeError, match="missing 1 required argument: 'name'"):
        Ours(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Ours(1, "a", colour=2)
    with pytest.raises(TypeError, match="multiple values for argument 'pid'"):
        Ours(1, "a", pid=2)
    with pytest.raises(TypeError, match="takes 5 positional arguments but 6 were given"):
        Ours(1, "a", (), 2, 3)


def test_annotations_stay_text_for_codec() -> None:
    assert Ours.__annotations__ == {"pid": "int", "name": "str", "tags": "Tuple[str, ...]",
                                    "parent": "Optional[int]"}


def test_docstring_as_namedtuple_makes_it() -> None:
    assert Bare.__doc__ == "Bare(a)" and TypedBare.__doc__ == "TypedBare(a,)"
    assert Ours.__doc__ == "A record with methods."


def test_repr_and_pickle() -> None:
    value = Ours(1, "a", ("t",))
    assert repr(value) == "Ours(pid=1, name='a', tags=('t',), parent=None)"
    assert repr(Bare(1)) == "Bare(a=1)"
    again = pickle.loads(pickle.dumps(value))
    assert again == value and type(again) is Ours


def test_default_before_required_is_refused() -> None:
    with pytest.raises(TypeError, match="a field without a default follows"):
        class Wrong(frozen.NamedTuple):  # type: ignore[misc]
            a: int = 0
            b: int


def test_super_works_in_a_method() -> None:
    class Counted(frozen.NamedTuple):  # type: ignore[misc]
        n: int

        def __repr__(self) -> str:
            return "counted " + super().__repr__()

    assert repr(Counted(2)) == "counted Counted(n=2)"

