"""Can every job's user use what slurmd runs as that user?

slurmd runs the TaskProlog as the job's user, who must be able to search every directory
above the interpreter, the hooks, the package and the config, read the package and the
config, and execute the interpreter (a venv under /root, mode 0700, passes every test run
as root, then fails each MPS job with "Permission denied"). Only "others" bits count: job
users are arbitrary. Each function returns "" when others can use the path, else why not
("/root is mode 0700").
"""

import os
import stat
from pathlib import PurePath
from typing import Iterable

# Bounds the walk of a package tree (the installed mps_health has about 150 entries).
MAX_ENTRIES = 5000


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _parents_searchable(path: str) -> str:
    """Each directory from / down to ``path``'s parent must be searchable (o+x); the
    path as written and the path its symlinks lead to are both walked."""
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        for d in [*reversed(PurePath(candidate).parents)] or [PurePath("/")]:
            st = os.stat(d)
            if not st.st_mode & stat.S_IXOTH:
                return f"{d} is {_mode(st)}"
    return ""


def _has(path: str, bits: int, what: str) -> str:
    st = os.stat(path)
    if st.st_mode & bits != bits:
        return f"{path} is {_mode(st)} ({what})"
    return ""


def executable(path: str) -> str:
    """``path`` (an interpreter, a script) can be run by others."""
    return _parents_searchable(path) or _has(path, stat.S_IXOTH, "not executable by others")


def readable(path: str) -> str:
    """A file (the config) others can read."""
    return _parents_searchable(path) or _has(path, stat.S_IROTH, "not readable by others")


def directory(path: str) -> str:
    """A directory others can enter."""
    return _parents_searchable(path) or _has(path, stat.S_IXOTH, "not searchable by others")


def package_tree(paths: Iterable[str]) -> str:
    """Python package dirs others can import from: each dir and the dir holding it
    listable and searchable (o+rx: the import system lists them), sources readable (o+r)."""
    seen = 0
    for top in paths:
        top = os.path.realpath(top)
        problem = directory(top) or _has(os.path.dirname(top), stat.S_IROTH | stat.S_IXOTH,
                                         "not listable by others")
        if problem:
            return problem
        for here, dirs, files in os.walk(top):
            seen += len(dirs) + len(files)
            if seen > MAX_ENTRIES:
                return ""
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            problem = _has(here, stat.S_IROTH | stat.S_IXOTH, "not listable by others") or next(
                (p for name in files if name.endswith(".py")
                 and (p := _has(os.path.join(here, name), stat.S_IROTH,
                                "not readable by others"))), "")
            if problem:
                return problem
    return ""
