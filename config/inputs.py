"""Files handed to mps-health as input, the config and snapshots: read and parsed with
bounded work whatever is in them.

A snapshot may come from anyone (a support bundle, a user's job dir), and a config is
parsed by every check, hook and exporter, so neither may make a run hang, crash or eat
the node's memory:

- ``read_text``: through ``safefiles.read_small`` (regular files only, opened
  non-blocking so a FIFO is refused instead of waited on, at most ``limit`` bytes: a
  larger file is refused, never cut), then checked to be UTF-8, naming the line of the
  first bad byte.
- ``yaml_nesting``: libyaml's composer recurses in C, so a document nested some
  ten thousand levels deep crashes the interpreter (SIGSEGV) before Python can raise
  RecursionError. Its event parser keeps its own stack, so the depth is measured on the
  events first and a deep file is refused before the composer sees it. libyaml 0.2.6
  (in PyYAML 6.0.4's wheels) refuses past 1000 levels itself, in its scanner, which
  reads ahead of the events: ``yaml_too_deep`` words that refusal as ours, so a deep
  file gets the same line whichever libyaml parsed it.
- ``tree_size``: a YAML alias repeats a whole subtree by reference (a few hundred
  bytes can stand for a billion values, or for a cycle); walking, quoting or saving
  such a value costs the expanded size. Parsed data is walked once with a budget of
  ``MAX_VALUES`` values and ``MAX_DEPTH`` levels, and refused past either.

Every failure is ``InputError``: one line saying what is wrong; the caller adds the file.
"""

from __future__ import annotations

import errno
from typing import Any, List, Optional

MAX_DEPTH = 64  # levels of nesting; mps-health's own files use fewer than ten
# Each level of nesting takes a byte at least, and libyaml's composer needs some 300
# bytes of C stack a level (it crashed between 20000 and 40000 levels on an 8 MiB
# stack): a text this short cannot reach a dangerous depth, and skipping the event pass
# saves a typical config a third of its parse time.
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


def yaml_nesting(text: str, loader: Any) -> None:
    """InputError if the YAML document nests deeper than MAX_DEPTH (see the module doc).
    Syntax errors are left to the real load, which words them."""
    if len(text) <= SHALLOW_BYTES:
        return  # too short to nest deep enough to hurt; ``tree_size`` bounds the rest
    import yaml

    depth = 0
    opens = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
    closes = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, opens):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    where = f"line {mark.line + 1}: " if mark is not None else ""
                    raise InputError(f"{where}nested more than {MAX_DEPTH} levels deep")
            elif isinstance(event, closes):
                depth -= 1
    except yaml.YAMLError as e:
        yaml_too_deep(e)
        return


# libyaml's own words (0.2.6 on) when a document passes its nesting limit.
LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


def yaml_too_deep(error: Any) -> None:
    """InputError if the YAML error ``error`` is libyaml's own nesting limit: its limit
    (1000 levels by default) is above MAX_DEPTH, so the file nests deeper than we take,
    said as ``yaml_nesting`` says it. Any other error is left to the caller."""
    if getattr(error, "problem", None) != LIBYAML_TOO_DEEP:
        return
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    raise InputError(f"{where}nested more than {MAX_DEPTH} levels deep")


def tree_size(data: Any, limit: int = MAX_VALUES) -> int:
    """How many values ``data`` holds, aliases counted each time they appear; InputError
    past ``limit`` values or MAX_DEPTH levels. Stops as soon as either is passed, so a
    cycle or an alias bomb costs at most ``limit`` steps."""
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
