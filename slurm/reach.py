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
from typing import Iterable, Tuple

# Bounds the walk of a package tree (the installed mps_health has about 150 entries).
MAX_ENTRIES = 5000
# What others need on a path: (mode bits, what the path is when they lack them).
Need = Tuple[int, str]
EXECUTABLE: Need = (stat.S_IXOTH, "not executable by others")  # an interpreter, a script
READABLE: Need = (stat.S_IROTH, "not readable by others")  # the config
SEARCHABLE: Need = (stat.S_IXOTH, "not searchable by others")  # a directory
LISTABLE: Need = (stat.S_IROTH | stat.S_IXOTH, "not listable by others")


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _has(path: str, need: Need) -> str:
    st = os.stat(path)
    return f"{path} is {_mode(st)} ({need[1]})" if st.st_mode & need[0] != need[0] else ""


def usable(path: str, need: Need) -> str:
    """Others have ``need`` on ``path``, and can search (o+x) each directory from / down to
    its parent: the path as written and the path its symlinks lead to are both walked."""
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        for d in [*reversed(PurePath(candidate).parents)] or [PurePath("/")]:
            st = os.stat(d)
            if not st.st_mode & stat.S_IXOTH:
                return f"{d} is {_mode(st)}"
    return _has(path, need)


def package_tree(paths: Iterable[str]) -> str:
    """Python package dirs others can import from: each dir and the dir holding it
    listable and searchable (o+rx: the import system lists them), sources readable (o+r)."""
    seen = 0
    for top in paths:
        top = os.path.realpath(top)
        problem = usable(top, SEARCHABLE) or _has(os.path.dirname(top), LISTABLE)
        if problem:
            return problem
        for here, dirs, files in os.walk(top):
            seen += len(dirs) + len(files)
            if seen > MAX_ENTRIES:
                return ""
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            problem = _has(here, LISTABLE) or next(
                (p for name in files if name.endswith(".py")
                 and (p := _has(os.path.join(here, name), READABLE))), "")
            if problem:
                return problem
    return ""
