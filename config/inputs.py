"""Input files (the config, snapshots): read and parsed with bounded work whatever is in them.

A snapshot may come from anyone, and a config is parsed by every check, hook and exporter,
so neither may make a run hang, crash or eat the node's memory:

- ``read_text``: ``safefiles.read_small`` (regular files only, opened non-blocking so a
  FIFO is refused, not waited on; a file over ``limit`` is refused, never cut), then UTF-8.
- ``parse_yaml``: libyaml's composer recurses in C, so a document nested some ten
  thousand levels crashes the interpreter (SIGSEGV). Its event parser keeps its own
  stack, so the depth is measured on the events first (libyaml 0.2.6 on also refuses
  past 1000 levels itself, in its scanner: worded as ours). Then ``tree_size``.
- ``tree_size``: a YAML alias repeats a subtree by reference (a few hundred bytes can be a
  billion values, or a cycle). Parsed data is walked once, refused past ``MAX_VALUES``
  values or ``MAX_DEPTH`` levels.

Every failure is ``InputError``: one line saying what is wrong; the caller adds the file.
"""

from __future__ import annotations

import errno
from typing import Any, List, Optional

MAX_DEPTH = 64  # levels of nesting; mps-health's own files use fewer than ten
# A level of nesting takes a byte at least, and libyaml's composer crashes only past some
# 20000 levels: a text this short cannot reach a dangerous depth (no event pass for it;
# ``tree_size`` bounds the rest).
SHALLOW_BYTES = 2048
MAX_VALUES = 100_000  # values in a parsed config, aliases counted as often as they repeat


class InputError(ValueError):
    """An input file that cannot be used, worded as the line the user sees."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def read_text(path: str, limit: int, follow: bool = False) -> Optional[str]:
    """The UTF-8 text of regular file ``path``; None if it does not exist. ``follow``:
    a symlink is followed (a path the admin chose); otherwise it is refused."""
    from mps_health.hostio.safefiles import read_small

    try:
        data = read_small(path, limit, follow=follow)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError("is a symbolic link, which is not followed here: give the "
                             "file itself") from None
        if e.errno == errno.EFBIG:
            raise InputError(f"larger than {_size(limit)}: not a file mps-health would "
                             "write or read") from None
        raise InputError(f"cannot read: {e.strerror or e}") from None
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): "
                         "save it as UTF-8") from None


# libyaml's own words (0.2.6 on) past its nesting limit (1000 levels), and ours past MAX_DEPTH.
TOO_DEEP = "exceeded maximum nesting depth"


def parse_yaml(text: str) -> Any:
    """The data of a YAML document; InputError (with the line where known) for one too
    deep, too large (``tree_size``) or not valid YAML."""
    import yaml  # only when there is a file: without one, the defaults need no parser
    from mps_health.model.printable import escape

    # libyaml's loader where PyYAML has it (the same safe subset, in C), else PyYAML's own.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=loader) if len(text) > SHALLOW_BYTES else ():
            if isinstance(event, yaml.CollectionStartEvent):  # a sequence or a mapping
                depth += 1
                if depth > MAX_DEPTH:  # worded below as libyaml's own refusal is
                    at: Any = event.start_mark  # libyaml's Mark or PyYAML's
                    raise yaml.MarkedYAMLError(problem=TOO_DEEP, problem_mark=at)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem == TOO_DEEP:
            raise InputError(f"{where}nested more than {MAX_DEPTH} levels deep") from None
        raise InputError(f"{where}not valid YAML: {escape(problem)}") from None
    except ValueError as e:  # an integer of over 4300 digits, a date out of range
        raise InputError(f"not valid YAML: {escape(str(e))}") from None
    tree_size(data)
    return data


def tree_size(data: Any, limit: int = MAX_VALUES) -> int:
    """Values in ``data``, aliases counted each time; InputError as soon as it passes
    ``limit`` values or MAX_DEPTH levels, so a cycle or alias bomb costs ``limit`` steps."""
    count = 0
    todo: List[tuple] = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        count += 1
        if count > limit:
            raise InputError(f"holds more than {limit} values (YAML aliases counted each "
                             "time they are used)")
        if depth > MAX_DEPTH:
            raise InputError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            todo.extend((k, depth + 1) for k in value)
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)
    return count
