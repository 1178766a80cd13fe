"""Parsed forms of configuration files, kept so that a check need not parse them again.

Two users: the default config file (below) and the systemd-tmpfiles.d files
(``probes.tmpfiles``: eighteen files of some 300 lines on a Debian node, parsed on every
check for rules that change when a package is installed). ``read_kept``/``keep`` hold
the rules both follow; each caller says what its data was read from (its key) and when
that still holds.

``import yaml`` compiles the regular expressions of PyYAML's resolver: about 100 M
instructions, three times what starting the interpreter costs, on every check of a node
that has /etc/mps-health/config.yaml, for a file that changes a few times a year. So
the YAML that file parses to is kept as JSON in ``CACHE`` (/run: gone at boot), with the
file's identity when it was read: device, inode, size, modification and change times in
nanoseconds (any write or rename changes the change time). A run whose ``stat`` of the
file matches uses the kept data and reads no YAML; the data is validated as a parsed
file is (``config.from_mapping``), so a cached config is never trusted more than the
file. Any other file (--config elsewhere) is parsed every time.

Only root writes the cache; it is used only while it and its dir are root's and
writable by no one else, and it is read without following links, so no user can put
a config in front of root. Data JSON cannot hold as YAML gave it (keys other than
strings, dates, binary) is not kept. Anything wrong with the cache only costs the parse.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional

CACHE = "/run/mps-health/config.json"
MAX_BYTES = 8 << 20  # a config of 1 MiB whose aliases expand a little still fits
FORMAT = 2  # {"format", "key", "data"}


def identity(st: os.stat_result) -> List[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _root_only(st: os.stat_result) -> bool:
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def lookup(path: str, st: os.stat_result) -> Optional[Any]:
    """The data kept for ``path`` as ``st`` describes it; None when there is none."""
    key = [path, identity(st)]
    return read_kept(CACHE, lambda kept: kept == key)


def read_kept(cache: str, fresh: Callable[[Any], bool]) -> Optional[Any]:
    """The data kept in ``cache`` when ``fresh`` says its key (what the data was read from,
    as it was then) still holds; None when there is none, or it is not root's alone."""
    from mps_health.hostio import jsontext
    from mps_health.hostio.safefiles import open_regular, read_upto

    directory, name = os.path.split(cache)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _root_only(os.fstat(dfd)):
            return None
        fd, cst = open_regular(name, dfd)
        try:
            if not _root_only(cst) or cst.st_size > MAX_BYTES:
                return None
            kept = jsontext.loads(read_upto(fd, MAX_BYTES, cst.st_size).decode("utf-8"))
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(dfd)
    if not isinstance(kept, dict) or kept.get("format") != FORMAT \
            or not fresh(kept.get("key")):
        return None
    return kept.get("data")


def _plain(value: Any) -> bool:
    """Would JSON give ``value`` back as it is? (The tree is bounded: inputs.tree_size.)"""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
        elif not (v is None or isinstance(v, (str, int, float))):  # bool is an int
            return False
    return True


def remember(path: str, st: os.stat_result, data: Any) -> None:
    """Keep ``data``, parsed from ``path`` as ``st`` describes it, if root and it can."""
    keep(CACHE, [path, identity(st)], data)


def keep(cache: str, key: Any, data: Any) -> None:
    """Keep ``data`` in ``cache`` under ``key``, if root and JSON holds it as it is."""
    if os.geteuid() != 0 or not _plain(data):
        return
    from mps_health.hostio import jsontext
    from mps_health.hostio.safefiles import write_atomic

    try:
        text = jsontext.dumps({"format": FORMAT, "key": key, "data": data})
        if len(text) > MAX_BYTES:
            return
        os.makedirs(os.path.dirname(cache), mode=0o755, exist_ok=True)
        write_atomic(cache, text.encode(), mode=0o644)
    except (OSError, ValueError, TypeError, RecursionError):
        pass  # nothing kept: the next run reads the files again
