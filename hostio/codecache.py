"""The compiled code of the modules the commands import, kept in one file.

Python finds and loads each module on its own: a walk of the package's path, a stat of
the source, an open, read and check of its ``.pyc``, a spec and a loader built, about
0.27 M instructions before the module's body runs, and four to six system calls. A
plain check imports some fifty modules of ours, so that alone was a quarter of what the
check adds to starting Python. The scripts in ``bin/`` call ``serve`` first: it reads
one file holding the compiled code of the modules earlier runs imported, and puts a
finder in front of Python's own that serves ``mps_health`` modules from it.

Each entry is checked against its source, as Python checks a ``.pyc`` but closer: the
source's mtime in ns, size and inode, as this machine saw them when the entry was
written (an upgrade writes new files). A module whose entry is missing or stale, and
every other module, goes to Python's import system as usual. At the end of such a run
(``save``, from ``cli.exit_now``) the file is written anew with what this run imported
and what it held, where and when Python would write a ``.pyc``: beside the package's
own ones, in ``__pycache__``, by a user who may write there (root's runs; a monitoring
user's runs are served what root's wrote). All commands share the file: what one
command imports, the others mostly import too.

The file is trusted as the ``.pyc`` files beside it are, and a little less: it must be
a regular file, not a link, owned by this user or root, writable by no one else, and
under 64 MiB; anything else is ignored (Python's import then serves every module).
``PYTHONDONTWRITEBYTECODE`` (or ``python -B``) turns it off: no file read or written.
"""

from __future__ import annotations

import marshal
import os
import sys

from mps_health.hostio.safefiles import open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec as Spec
    from types import CodeType, ModuleType
    from typing import Dict, List, Optional, Sequence, Tuple

    # name -> (path under the package, is a package, the source's (mtime ns, size,
    #          inode), offset of its code in the file, its length)
    Entry = Tuple[str, bool, Tuple[int, int, int], int, int]

PACKAGE = "mps_health"
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 64 << 20
FORMAT = 1
# The spec type of every module (importlib.machinery.ModuleSpec without importing
# importlib.machinery).
ModuleSpec = type(sys.__spec__)


def cache_path() -> Optional[str]:
    """Where the file lives; None where this Python keeps no bytecode."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    opt = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    return f"{PKG_DIR}/__pycache__/{PACKAGE}.{tag}{opt}.codes"


def _magic() -> bytes:
    """The bytecode's version, what a .pyc's first four bytes say (importlib.util's
    MAGIC_NUMBER, without importing importlib.util)."""
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", None)
    return magic if isinstance(magic, bytes) else sys.version.encode()


_CODE = type(_magic.__code__)  # types.CodeType, without importing types
_MODULE = type(sys)  # types.ModuleType
# A .pyc's name where Python's import would put it, without a prefix for all of them
# (where sys.pycache_prefix is set, importlib names it as usual).
_PYC_NAMING = sys.implementation.cache_tag is not None and not sys.pycache_prefix
_PYC_TAG = (f"{sys.implementation.cache_tag}"
            f"{f'.opt-{sys.flags.optimize}' if sys.flags.optimize else ''}.pyc")


class CodeFinder:
    """A meta path finder and loader for the modules the file holds, while fresh."""

    def __init__(self, path: str, index: Dict[str, Entry], fd: int = -1,
                 identity: Tuple[int, int] = (0, 0)) -> None:
        self.path = path
        self.index = index
        # The file stays open, and each module's code is read when it is imported: the
        # run reads only what it imports, into memory it then frees (reading the whole
        # file cost a fresh page for every 4 KiB of it, most of a millisecond). A file
        # written anew meanwhile is a new file: this one reads the one it checked.
        self.fd = fd
        self.identity = identity
        self.missed = False  # a module of ours came from Python's import system

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[Spec]:
        if name.partition(".")[0] != PACKAGE:
            return None
        if not self.fresh(name):
            self.missed = True
            return None
        entry = self.index[name]
        origin = f"{PKG_DIR}/{entry[0]}"
        # (A loader by protocol, not by importlib.abc's base class: importing that costs.)
        spec = ModuleSpec(name, self, origin=origin,  # type: ignore[arg-type]
                          is_package=entry[1])
        spec.has_location = True  # sets __file__, as for a module read from its file
        if entry[1]:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        if _PYC_NAMING:  # __cached__ as Python's import names it (cache_from_source)
            head, _, tail = origin.rpartition("/")
            spec.cached = f"{head}/__pycache__/{tail[:-3]}.{_PYC_TAG}"
        return spec

    def create_module(self, spec: Spec) -> ModuleType:
        """The module with the attributes import would give it already set: importlib
        then finds each one there, rather than failing to (an AttributeError made and
        dropped for each) and setting it, a fifth of what importing a module cost."""
        module = _MODULE(spec.name)
        module.__loader__ = self  # type: ignore[assignment]  # a loader by protocol
        module.__spec__ = spec
        module.__file__ = spec.origin
        module.__cached__ = spec.cached  # type: ignore[attr-defined]
        if spec.submodule_search_locations is not None:
            module.__package__ = spec.name
            module.__path__ = spec.submodule_search_locations
        else:
            module.__package__ = spec.name.rpartition(".")[0]
        return module

    def exec_module(self, module: ModuleType) -> None:
        entry = self.index[module.__name__]
        try:
            code = marshal.loads(self.blob(entry))
            if type(code) is not _CODE:
                raise ValueError("not code")
        except (OSError, ValueError, EOFError, TypeError):  # damaged: compile it, write anew
            self.missed = True
            del self.index[module.__name__]
            code = _compiled(f"{PKG_DIR}/{entry[0]}")[1]
        exec(code, module.__dict__)

    def fresh(self, name: str) -> bool:
        """Does the file hold module ``name`` as its source is now?"""
        entry = self.index.get(name)
        return entry is not None and _fresh(entry)

    def kept(self, name: str) -> Optional[Tuple[str, bool, Tuple[int, int, int], bytes]]:
        """What the file holds for module ``name``, if still fresh."""
        if not self.fresh(name):
            return None
        entry = self.index[name]
        try:
            return (*entry[:3], self.blob(entry))
        except (OSError, EOFError):
            return None

    def blob(self, entry: Entry) -> bytes:
        """An entry's marshalled code, read from the file it was indexed in (OSError if
        that fd no longer names it: something closed it, and the number was reused)."""
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) != self.identity:
            raise OSError(9, "the kept code's file is no longer open", self.path)
        data = os.pread(self.fd, entry[4], entry[3])
        if len(data) != entry[4]:
            raise EOFError("the kept code's file was cut short")
        return data


def _key(st: os.stat_result) -> Tuple[int, int, int]:
    return st.st_mtime_ns, st.st_size, st.st_ino


def _fresh(entry: Entry) -> bool:
    try:
        return _key(os.stat(f"{PKG_DIR}/{entry[0]}")) == entry[2]
    except OSError:
        return False


def _compiled(origin: str) -> Tuple[os.stat_result, CodeType]:
    """Our own source file's stat and code, as Python's import would compile it."""
    with open(origin, "rb") as f:
        st = os.fstat(f.fileno())
        source = f.read()
    return st, compile(source, origin, "exec", dont_inherit=True)


def _open(path: str) -> Optional[Tuple[int, os.stat_result]]:
    """The file, open, if it may be trusted (see the module's doc)."""
    try:
        fd, st = open_regular(path)
    except Exception:  # missing, a link, not a file, no fd left: Python's import serves
        return None
    if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()) or st.st_size > LIMIT:
        os.close(fd)
        return None
    return fd, st


def _load(path: str) -> Optional[CodeFinder]:
    """A finder for the file's fresh entries; None unless it is whole and ours."""
    opened = _open(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        head = int.from_bytes(os.pread(fd, 4, 0), "little")
        if 4 + head > st.st_size:
            raise ValueError("cut short")
        form, magic, index = marshal.loads(os.pread(fd, head, 4))
        if form != FORMAT or magic != _magic() or not isinstance(index, dict):
            raise ValueError("another format or Python")
        base = 4 + head
        out: Dict[str, Entry] = {}
        for name, (rel, is_pkg, key, offset, length) in index.items():
            if offset < 0 or length < 0 or base + offset + length > st.st_size:
                raise ValueError("an entry outside the file")
            out[name] = (rel, is_pkg, key, base + offset, length)
    except (OSError, ValueError, EOFError, TypeError):  # damaged: rewritten at the end
        os.close(fd)
        return None
    return CodeFinder(path, out, fd, (st.st_dev, st.st_ino))


def serve() -> None:
    """Serve this package's modules from the file, as far as it is fresh. Nothing with
    PYTHONDONTWRITEBYTECODE (or -B): the file is neither read nor written then."""
    path = cache_path()
    if path is None or sys.dont_write_bytecode:
        return
    try:
        finder = _load(path)
    except Exception:  # whatever is wrong with the file, Python's import serves
        finder = None
    if finder is None:
        finder = CodeFinder(path, {})
        finder.missed = True
    sys.meta_path.insert(0, finder)


def _finder() -> Optional[CodeFinder]:
    for f in sys.meta_path:
        if isinstance(f, CodeFinder):
            return f
    return None


def save() -> None:
    """Write the file anew when this run imported a module of ours it did not hold, and
    this user may write there. Never raises: the file is only ever a speed-up."""
    finder = _finder()
    if finder is None or not finder.missed:
        return
    parent = os.path.dirname(finder.path)
    if not os.access(parent if os.path.isdir(parent) else PKG_DIR, os.W_OK):
        return  # a monitoring user's run: compiling it all for nothing would cost more
    if all(finder.fresh(name) for name, _ in _ours()):
        return  # what was missed is no module of ours (an import that failed)
    try:
        _write(finder)
    except (OSError, ValueError, SyntaxError, MemoryError):
        pass


def _ours() -> List[Tuple[str, str]]:
    """(name, source file) of each module of this package the run imported."""
    found = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if (name.partition(".")[0] == PACKAGE and isinstance(origin, str)
                and origin.startswith(PKG_DIR + "/") and origin.endswith(".py")):
            found.append((name, origin))
    return found


def _write(finder: CodeFinder) -> None:
    codes: Dict[str, Tuple[str, bool, Tuple[int, int, int], bytes]] = {}
    for name, origin in _ours():
        kept = finder.kept(name)
        if kept is None:
            st, code = _compiled(origin)
            kept = (origin[len(PKG_DIR) + 1:], origin.endswith("/__init__.py"), _key(st),
                    marshal.dumps(code))
        codes[name] = kept
    for name in finder.index:  # what other runs imported, still fresh
        if name not in codes:
            kept = finder.kept(name)
            if kept is not None:
                codes[name] = kept
    index: Dict[str, Entry] = {}
    offset = 0
    for name in sorted(codes):
        rel, is_pkg, key, marshalled = codes[name]
        index[name] = (rel, is_pkg, key, offset, len(marshalled))
        offset += len(marshalled)
    head = marshal.dumps((FORMAT, _magic(), index))
    body = b"".join(codes[name][3] for name in sorted(codes))
    from mps_health.hostio.safefiles import write_atomic

    os.makedirs(os.path.dirname(finder.path), exist_ok=True)
    write_atomic(finder.path, len(head).to_bytes(4, "little") + head + body)
