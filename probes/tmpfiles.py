"""The systemd-tmpfiles configuration, merged as systemd merges it: a file in an earlier
``SEARCH_DIRS`` dir masks one of the same name in a later one, and the surviving files
are read (each at most ``MAX_FILE_BYTES``) in file-name order.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Set, Tuple

from mps_health.hostio.resources import raise_if_starved
from mps_health.hostio.safefiles import read_small
from mps_health.model.facts import TmpfilesFacts, TmpfilesRule
from mps_health.probes.context import Context

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
    chars = iter(line)
    for c in chars:
        if quote:
            if c == quote:
                quote = ""
            else:  # a backslash takes the next character as it is
                current.append(next(chars, c) if c == "\\" else c)
        elif c in "\"'":
            quote, in_field = c, True
        elif c.isspace():
            if in_field:
                fields.append("".join(current))
                current, in_field = [], False
        else:
            current.append(c)
            in_field = True
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
            if len(fields) < 2:
                raise ValueError("a type and a path are needed")
            rtype = fields[0].rstrip("!-=~^+")  # modifiers do not change what a rule covers
            if not rtype:
                raise ValueError("no rule type")
        except ValueError as e:
            errors.append(f"{file}:{number}: {e}")
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
    if not is_link:  # the listing's d_type said so: no readlink per file
        return real
    try:
        link = os.readlink(real)
    except OSError:
        return real  # no longer a link (or gone: the read says so)
    if link == "/dev/null":
        return None
    return ctx.path(link) if os.path.isabs(link) else os.path.join(os.path.dirname(real), link)


def gather(ctx: Context, instances: object = None) -> TmpfilesFacts:
    """The merged rules, read and parsed now."""
    listing: Dict[str, List[str]] = {}
    links: Set[str] = set()
    for directory in SEARCH_DIRS:
        real = ctx.path(directory)
        if directory == "/lib/tmpfiles.d" and os.path.realpath(real) == os.path.realpath(
                ctx.path("/usr/lib/tmpfiles.d")):
            continue  # merged /usr: the same directory twice
        try:
            with os.scandir(real) as it:
                confs = [entry for entry in it if entry.name.endswith(".conf")]
            links.update(f"{directory}/{entry.name}" for entry in confs if entry.is_symlink())
        except OSError as e:  # out of fds: our trouble, not a missing dir
            raise_if_starved(e, f"list {real}")
            continue
        listing[directory] = [entry.name for entry in confs]
    if not listing:
        return TmpfilesFacts(False, (), ())
    files = effective_files(listing)
    rules: List[TmpfilesRule] = []
    errors: List[str] = []
    for path in files:
        target = _target(ctx, path, path in links)  # None: masked, read as empty
        try:
            data = read_small(target, MAX_FILE_BYTES, follow=True) if target else None
        except OSError as e:
            errors.append(f"{path}: cannot read: {e.strerror}")
            continue
        file_rules, file_errors = parse_tmpfiles((data or b"").decode("utf-8", "replace"), path)
        rules.extend(file_rules)
        errors.extend(file_errors)
    return TmpfilesFacts(True, tuple(files), tuple(rules), tuple(errors))


VALUE_TYPE = TmpfilesFacts
