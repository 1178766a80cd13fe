"""gres.conf as slurmd reads it, for this node, and the device files it names.

Slurm's rules kept: keys are case-insensitive; ``#`` starts a comment; a trailing
backslash continues the line; ``Include FILE`` is relative to the including file's dir;
a ``NodeName=<hostlist>`` line applies only to the nodes it names, others to every node;
``File=/dev/nvidia[0-3]`` (or a comma list) is one device per name; ``Count`` takes
K/M/G/T/P suffixes and, for a shared GRES like mps with several files, is spread evenly
over them; ``AutoDetect`` may stand on a line of its own. It lives beside slurm.conf.
"""

import errno
import os
import stat
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from mps_health.probes.context import Context, node_name
from mps_health.probes.hostlist import ParseError, expand, parse_count

KEYS = {"autodetect": "AutoDetect", "count": "Count", "cores": "Cores", "cpus": "CPUs",
        "file": "File", "files": "File", "flags": "Flags", "links": "Links",
        "multiplefiles": "MultipleFiles", "name": "Name", "nodename": "NodeName",
        "type": "Type"}
DEVICE_KINDS = {stat.S_IFCHR: "char", stat.S_IFBLK: "block", stat.S_IFREG: "file"}
MAX_INCLUDE_DEPTH = 10
MAX_FILE_BYTES = 4 << 20  # per file: a gres.conf for hundreds of nodes fits


class GresLine(NamedTuple):
    """One GRES record of gres.conf that applies to this node."""

    where: str  # "FILE:LINE"
    name: str  # gpu, mps, shard, ...
    type: Optional[str]
    files: Tuple[str, ...]  # expanded File= (empty when none)
    quantity: int  # Count=, else one per file, else 1


class DeviceFile(NamedTuple):
    """A File= device as found on disk (stat follows links, as slurmd does)."""

    path: str
    kind: str  # "char" | "block" | "file" | "other" | "missing" | "error"
    minor: Optional[int] = None  # minor number of a device node


class GresConf(NamedTuple):
    path: str
    found: bool  # False when there is no gres.conf (GRES then come from slurm.conf alone)
    node: str
    lines: Tuple[GresLine, ...] = ()
    autodetect: Optional[str] = None
    devices: Tuple[DeviceFile, ...] = ()
    errors: Tuple[str, ...] = ()  # "FILE:LINE: what is wrong", one per bad line


def logical_lines(text: str) -> List[Tuple[int, str]]:
    """(first line number, text) with comments removed and backslash continuations joined."""
    out: List[Tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        hash_at = line.find("#")
        while hash_at > 0 and line[hash_at - 1] == "\\":  # an escaped '#'
            line = line[:hash_at - 1] + line[hash_at:]
            hash_at = line.find("#", hash_at)
        if hash_at >= 0:
            line = line[:hash_at]
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip():
            out.append((start, line.strip()))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def parse_pairs(line: str) -> Dict[str, str]:
    """``Key=Value`` words of one line, keys normalised; ParseError for anything else."""
    pairs: Dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        canonical = KEYS.get(key.lower())
        if not sep:
            raise ParseError(f"'{word}' is not Key=Value")
        if canonical is None:
            raise ParseError(f"unknown key '{key}'")
        if canonical in pairs:
            raise ParseError(f"'{canonical}' given twice")
        pairs[canonical] = value.strip('"')
    return pairs


def parse_gres_conf(text: str, node: str, where: str = "gres.conf",
                    read_include: Optional[Callable[[str], str]] = None,
                    depth: int = 0) -> GresConf:
    """The records of ``text`` that apply to ``node`` (pure but for ``read_include``)."""
    lines: List[GresLine] = []
    errors: List[str] = []
    autodetect: Optional[str] = None
    base = os.path.dirname(where) if "/" in where else ""
    for number, line in logical_lines(text):
        at = f"{where}:{number}"
        first, _, rest = line.partition(" ")
        try:
            if first.lower() == "include":
                sub = _include(rest.strip(), base, read_include, node, depth)
                lines.extend(sub.lines)
                errors.extend(sub.errors)
                autodetect = sub.autodetect or autodetect
                continue
            pairs = parse_pairs(line)
            if "NodeName" in pairs and node not in expand(pairs["NodeName"]):
                continue
            if "AutoDetect" in pairs:
                autodetect = pairs["AutoDetect"].lower()
            if "Name" not in pairs:
                if set(pairs) - {"NodeName", "AutoDetect"}:
                    raise ParseError("a GRES line needs Name=")
                continue
            files = tuple(expand(pairs.get("File", "")))  # "/dev/nvidia[0-1],/dev/x"
            count = parse_count(pairs["Count"]) if "Count" in pairs else max(1, len(files))
            lines.append(GresLine(at, pairs["Name"], pairs.get("Type") or None, files, count))
        except ParseError as e:
            errors.append(f"{at}: {e}")
    return GresConf(where, True, node, tuple(lines), autodetect, (), tuple(errors))


def _include(path: str, base: str, read_include: Optional[Callable[[str], str]], node: str,
             depth: int) -> GresConf:
    """The included file's records; ParseError saying why it was not read."""
    if not path:
        raise ParseError("Include without a file")
    if depth >= MAX_INCLUDE_DEPTH:
        raise ParseError(f"Include nested more than {MAX_INCLUDE_DEPTH} deep")
    full = path if path.startswith("/") or not base else os.path.join(base, path)
    if read_include is None:
        raise ParseError(f"Include {path} not read")
    try:
        text = read_include(full)
    except OSError as e:
        raise ParseError(f"Include {full}: {e.strerror or e}") from None
    return parse_gres_conf(text, node, full, read_include, depth + 1)


def device_kind(path: str) -> DeviceFile:
    """stat a File= device (the real path under --root)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return DeviceFile(path, "missing")
    except OSError:
        return DeviceFile(path, "error")
    kind = DEVICE_KINDS.get(stat.S_IFMT(st.st_mode), "other")
    return DeviceFile(path, kind, os.minor(st.st_rdev) if kind in ("char", "block") else None)


def read_gres_conf(ctx: Context, path: str, node: str) -> GresConf:
    """Read and parse ``path`` (as configured; read under --root), then stat its devices."""

    def read(p: str) -> str:
        from mps_health.hostio.safefiles import read_small

        data = read_small(ctx.path(p), MAX_FILE_BYTES, follow=True)  # may be a link
        if data is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", p)
        return data.decode("utf-8", "replace")

    try:
        text = read(path)
    except FileNotFoundError:
        return GresConf(path, False, node)
    except OSError as e:
        return GresConf(path, False, node, errors=(f"{path}: cannot read: {e.strerror}",))
    conf = parse_gres_conf(text, node, path, read)
    files = dict.fromkeys(f for line in conf.lines for f in line.files)
    return conf._replace(devices=tuple(device_kind(ctx.path(f))._replace(path=f)
                                       for f in files))


def gather(ctx: Context, instances: object) -> GresConf:
    from mps_health.config.slurm import settings

    # beside slurm.conf: SLURM_CONF's dir, else /etc/slurm
    conf = (ctx.env if ctx.env is not None else os.environ).get("SLURM_CONF") \
        or "/etc/slurm/slurm.conf"
    path = settings(ctx.config).gres_conf or os.path.join(os.path.dirname(conf), "gres.conf")
    return read_gres_conf(ctx, path, node_name(ctx.config, ctx.env))


VALUE_TYPE = GresConf
