"""The runbook on the node: each code's entry, from the docs/runbook.md the package carries.

docs/runbook.md (package data: ``mps-health explain CODE``). An entry is a ``###`` heading
(anchor as GitHub makes it, plus any ``<a id>`` in its first lines) with its text up to
the next heading, or a table row whose first cell holds ``<a id="CODE">`` (state,
meaning, what to do); a ``##`` heading is a check's group. Also the example config.
"""

import importlib.resources
import re
from typing import Dict, List, NamedTuple

RUNBOOK = "docs/runbook.md"
EXAMPLE_CONFIG = "contrib/config.example.yaml"

_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
_LINK = re.compile(r"\[([^\]]+)\]\(#([^)]+)\)")
_DOC_LINK = re.compile(r"\[([^\]]+)\]\(([\w.-]+\.md)(#[^)]*)?\)")  # another file of docs/
_CELL = re.compile(r"(?<!\\)\|")


class Entry(NamedTuple):
    code: str
    text: str  # what ``explain`` prints
    summary: str  # one line: the state and the first sentence
    group: bool = False  # a heading over a table of codes (a check's), not a code


def read_data(name: str) -> str:
    """A package data file's text (docs/runbook.md, contrib/config.example.yaml). A package
    installed without it (a wheel built by hand from a tree that lacks it) is an OSError
    naming the path: the edge says it in one line."""
    return importlib.resources.files("mps_health").joinpath(name).read_text("utf-8")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading ("check_mps timed out" -> check_mps-timed-out)."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _plain(text: str) -> str:
    """Markdown made for a terminal: anchors dropped, a link to another entry named as
    the command that shows it, a link to another doc as its file."""
    text = _ANCHOR.sub("", text)
    text = _DOC_LINK.sub(lambda m: f"{m.group(1)} (docs/{m.group(2)})", text)
    return _LINK.sub(lambda m: f"{m.group(1)} (mps-health explain {m.group(2)})", text)


def _first_sentence(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    end = -1
    while True:
        end = flat.find(". ", end + 1)
        # "e.g. " ends no sentence, and "CRITICAL." alone says too little
        if end < 0 or (flat[max(0, end - 3):end] not in ("e.g", "i.e") and end >= 20):
            break
    first = flat if end < 0 else flat[:end + 1]
    return first if len(first) <= limit else first[:limit - 3] + "..."


def _row(line: str, group: str) -> List[Entry]:
    cells = [c.strip() for c in _CELL.split(line.strip().strip("|"))]
    codes = _ANCHOR.findall(cells[0]) if cells else []
    if not codes or len(cells) < 4:
        return []
    state, meaning, todo = (_plain(c).replace("\\|", "|") for c in cells[1:4])
    return [Entry(code, f"{code} ({group} check): {state}\n\n{meaning}\n\nWhat to do: {todo}",
                  f"{state}: {_first_sentence(meaning)}") for code in codes]


def _block(heading: str, body: List[str], rows: List[str]) -> List[Entry]:
    # "pipe-dir-mode / log-dir-mode" names its codes by anchors; else the heading is one
    codes = [c for line in body[:3] for c in _ANCHOR.findall(line)] or [slug(heading)]
    # A table's rows are entries of their own: the heading's entry names them.
    lines = [_plain(line) for line in body if not line.startswith("|")]
    kept = [i for i, line in enumerate(lines) if line.strip()]  # no blank lines around
    lines = lines[kept[0]:kept[-1] + 1] if kept else []
    summary = _first_sentence(" ".join(lines)) if lines else f"codes: {', '.join(rows)}"
    if rows:
        lines += ["", f"Codes (mps-health explain CODE): {', '.join(rows)}"]
    text = "\n".join(lines).strip("\n")
    return [Entry(code, f"{heading}\n\n{text}", summary, bool(rows)) for code in codes]


def parse(runbook: str) -> Dict[str, Entry]:
    """Every entry of the runbook, by code (or heading anchor)."""
    found: Dict[str, Entry] = {}
    heading, group = "", ""
    body: List[str] = []
    rows: List[str] = []
    for line in [*runbook.splitlines(), "# end"]:
        if line.startswith("#"):
            if heading:
                for e in _block(heading, body, rows):
                    found.setdefault(e.code, e)
            heading = line.lstrip("#").strip() if line.startswith("### ") else ""
            group = (heading or line.lstrip("#").strip()).split()[0]
            body, rows = [], []
            continue
        if line.startswith("| <a id="):
            for e in _row(line, group):
                found.setdefault(e.code, e)
                rows.append(e.code)
            continue
        body.append(line)
    return found


def entries() -> Dict[str, Entry]:
    """The runbook of the installed package."""
    return parse(read_data(RUNBOOK))
