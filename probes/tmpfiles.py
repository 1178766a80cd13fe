"""The systemd-tmpfiles configuration, merged as systemd merges it.

A file in /etc/tmpfiles.d masks the file of the same name in /run/tmpfiles.d, which
masks /usr/local/lib and /usr/lib (and /lib on hosts without merged /usr); the
surviving files are then read in file-name order, whatever their directory.

The rules change when a package is installed; a node checks every few minutes. Root's
runs keep what was parsed (``KEPT`` in the run dir, through ``config/cache.py``) with
the identity of each search dir (a file added, removed or renamed changes it) and of
each file read (an edit in place changes it): a run that finds all of them as they were
reads no file. A --root run reads the tree and keeps nothing.
"""

from __future__ import annotations

import os

from mps_health.config.cache import identity, keep, read_kept
from mps_health.hostio.resources import raise_if_starved
from mps_health.hostio.safefiles import read_small
from mps_health.model.context import Context
from mps_health.model.facts import TmpfilesFacts, TmpfilesRule

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

# Larger is no tmpfiles.d file a package ships; read no further (bounded work).
MAX_FILE_BYTES = 1 << 20
# Highest priority first.
SEARCH_DIRS = ("/etc/tmpfiles.d", "/run/tmpfiles.d", "/usr/local/lib/tmpfiles.d",
               "/usr/lib/tmpfiles.d", "/lib/tmpfiles.d")


def split_line(line: str) -> List[str]:
    """Split a tmpfiles.d line into fields; double or single quotes group a field."""
    if '"' not in line and "'" not in line:
        return line.split()  # what _split_quoted gives such a line, at C speed: most lines
    return _split_quoted(line)


def _split_quoted(line: str) -> List[str]:
    fields: List[str] = []
    current: List[str] = []
    quote = ""
    in_field = False
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and i + 1 < len(line):
                i += 1
                current.append(line[i])
            else:
                current.append(c)
        elif c in "\"'":
            quote, in_field = c, True
        elif c.isspace():
            if in_field:
                fields.append("".join(current))
                current, in_field = [], False
        else:
            current.append(c)
            in_field = True
        i += 1
    if quote:
        raise ValueError("unterminated quote")
    if in_field:
        fields.append("".join(current))
    return fields


def parse_tmpfiles(text: str, file: str) -> Tuple[List[TmpfilesRule], List[str]]:
    """Rules of one file, and one error line per line that systemd would reject too."""
    rules: List[TmpfilesRule] = []
    errors: List[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            fields = split_line(line)
        except ValueError as e:
            errors.append(f"{file}:{number}: {e}")
            continue
        if len(fields) < 2:
            errors.append(f"{file}:{number}: a type and a path are needed")
            continue
        rtype = fields[0].rstrip("!-=~^+")  # modifiers do not change what a rule covers
        if not rtype:
            errors.append(f"{file}:{number}: no rule type")
            continue
        age = fields[5] if len(fields) > 5 else "-"
        rules.append(TmpfilesRule(file, number, rtype[0], fields[1], age))
    return rules, errors


def effective_files(listing: Dict[str, List[str]]) -> List[str]:
    """Paths of the files systemd reads, given each search dir's *.conf names."""
    chosen: Dict[str, str] = {}
    for directory in SEARCH_DIRS:  # highest priority first: the first name seen wins
        for name in listing.get(directory, []):
            chosen.setdefault(name, f"{directory}/{name}")
    return [chosen[name] for name in sorted(chosen)]


def _target(ctx: Context, path: str, is_link: bool) -> Optional[str]:
    """Where to read ``path`` (under --root: a link's absolute target read in the tree
    too); None when it is a link to /dev/null, which masks a file of that name."""
    real = ctx.path(path)
    if not is_link:  # the listing's d_type said so: no readlink (and its error) per file
        return real
    try:
        link = os.readlink(real)
    except OSError:
        return real  # no longer a link (or gone: the read says so)
    if link == "/dev/null":
        return None
    return ctx.path(link) if os.path.isabs(link) else os.path.join(os.path.dirname(real), link)


# In the run dir, root's: the parsed rules and what they were read from
# (config/cache.py says how such a form is kept and trusted).
KEPT = "tmpfiles.json"


def gather(ctx: Context) -> TmpfilesFacts:
    """The merged rules; from the kept form while neither a search dir (its entries) nor
    a file read (its content) changed since, else read and parsed, and kept anew."""
    if ctx.read_only:  # a --root tree: read it, keep nothing
        return read_all(ctx)
    cache = os.path.join(ctx.config.run_dir, KEPT)
    dirs = [_identity(ctx, d) for d in SEARCH_DIRS]  # before reading: a change since is seen

    def fresh(key: object) -> bool:
        """The same entries in each search dir, and each file read as it was then."""
        if not (isinstance(key, list) and len(key) == 2 and key[0] == dirs
                and isinstance(key[1], list)):
            return False
        return all(isinstance(f, list) and len(f) == 2 and isinstance(f[0], str)
                   and _identity(ctx, f[0]) == f[1] for f in key[1])

    kept = read_kept(cache, fresh)
    facts = _facts(kept) if kept is not None else None
    if facts is not None:
        return facts
    files_seen: Dict[str, Optional[List[int]]] = {}
    facts = read_all(ctx, files_seen)
    keep(cache, [dirs, [[f, files_seen.get(f)] for f in facts.files]], {
        "available": facts.available, "files": list(facts.files),
        "rules": [list(r) for r in facts.rules], "errors": list(facts.errors)})
    return facts


def _identity(ctx: Context, path: str) -> Optional[List[int]]:
    """What a change of ``path`` (followed) changes; None when it does not exist."""
    try:
        return identity(os.stat(ctx.path(path)))
    except OSError:
        return None


def _facts(kept: object) -> Optional[TmpfilesFacts]:
    """The kept facts if whole and of the right types; else None."""
    if not isinstance(kept, dict):
        return None
    try:
        files = tuple(kept["files"])
        rules = tuple(TmpfilesRule(*r) for r in kept["rules"])
        errors = tuple(kept["errors"])
        available = kept["available"]
    except (KeyError, TypeError):
        return None
    if not (isinstance(available, bool) and all(isinstance(f, str) for f in files)
            and all(isinstance(e, str) for e in errors)
            and all(isinstance(r.file, str) and isinstance(r.line, int)
                    and isinstance(r.type, str) and isinstance(r.path, str)
                    and isinstance(r.age, str) for r in rules)):
        return None
    return TmpfilesFacts(available, files, rules, errors)


def read_all(ctx: Context, files_seen: Optional[Dict[str, Optional[List[int]]]] = None
             ) -> TmpfilesFacts:
    """Every file read and parsed; ``files_seen`` gets each file's identity before its
    read."""
    listing: Dict[str, List[str]] = {}
    links = set()
    for directory in SEARCH_DIRS:
        real = ctx.path(directory)
        if directory == "/lib/tmpfiles.d" and os.path.realpath(real) == os.path.realpath(
                ctx.path("/usr/lib/tmpfiles.d")):
            continue  # merged /usr: the same directory twice
        try:
            with os.scandir(real) as entries:
                names = []
                for entry in entries:
                    if entry.name.endswith(".conf"):
                        names.append(entry.name)
                        if entry.is_symlink():
                            links.add(f"{directory}/{entry.name}")
        except OSError as e:  # out of fds: our trouble, not a missing dir
            raise_if_starved(e, f"list {real}")
            continue
        listing[directory] = names
    if not listing:
        return TmpfilesFacts(False, (), ())
    files = effective_files(listing)
    rules: List[TmpfilesRule] = []
    errors: List[str] = []
    for path in files:
        if files_seen is not None:
            files_seen[path] = _identity(ctx, path)
        target = _target(ctx, path, path in links)
        if target is None:
            continue  # a symlink to /dev/null masks a file: nothing to read
        try:
            data = read_small(target, MAX_FILE_BYTES, follow=True)
        except OSError as e:
            errors.append(f"{path}: cannot read: {e.strerror}")
            continue
        text = (data or b"").decode("utf-8", "replace")
        file_rules, file_errors = parse_tmpfiles(text, path)
        rules.extend(file_rules)
        errors.extend(file_errors)
    return TmpfilesFacts(True, tuple(files), tuple(rules), tuple(errors))


VALUE_TYPE = "TmpfilesFacts"  # read by codec, in this module's names


def gather_for(ctx: Context, instances: object) -> TmpfilesFacts:
    return gather(ctx)
