"""Slurm's bracket ranges, as in ``gpu[01-04,10]`` node names and ``/dev/nvidia[0-3]`` files.

Pure functions; a malformed expression raises ParseError naming what is wrong. Zero
padding is kept (``n[08-10]`` gives n08, n09, n10), as Slurm's hostlist does.
"""

from __future__ import annotations

from typing import List

MAX_NAMES = 100_000  # a typo like [0-99999999] must not eat the node's memory
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


class ParseError(ValueError):
    """Text that is not what Slurm would accept, worded for the admin."""


def parse_count(text: str, label: str = "Count=") -> int:
    """A count as Slurm writes it: digits, optionally K/M/G/T/P (powers of 1024)."""
    t = text.strip()
    factor = UNITS.get(t[-1:].upper(), 1)
    digits = t[:-1] if factor != 1 else t
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
        raise ParseError(f"{label}{text!r} is not a number")
    return int(digits) * factor


def split_top(text: str, sep: str = ",") -> List[str]:
    """Split on ``sep`` outside brackets and parentheses."""
    parts: List[str] = []
    depth, current = 0, ""
    for c in text:
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
            if depth < 0:
                raise ParseError(f"unbalanced '{c}' in {text!r}")
        if c == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    if depth != 0:
        raise ParseError(f"unclosed bracket in {text!r}")
    parts.append(current)
    return parts


def range_items(body: str, whole: str, limit: int = MAX_NAMES) -> List[str]:
    """``01-03,7`` into its numbers as text, zero padding kept; ``whole`` names it in errors,
    a range of ``limit`` numbers or more is refused."""
    items: List[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ParseError(f"bad range {part!r} in {whole} (expected N or N-M)")
        if not sep:
            items.append(lo)
            continue
        start, end = int(lo), int(hi)
        if end < start:
            raise ParseError(f"range {part!r} in {whole} runs backwards")
        if end - start >= limit:
            raise ParseError(f"range {part!r} in {whole} is too large")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        items.extend(str(n).zfill(width) for n in range(start, end + 1))
    return items


def expand_one(expr: str) -> List[str]:
    """``prefix[ranges]suffix`` (brackets may repeat) into every name, in order."""
    open_at = expr.find("[")
    if open_at < 0:
        if "]" in expr:
            raise ParseError(f"unbalanced ']' in {expr!r}")
        return [expr]
    close_at = expr.find("]", open_at)
    if close_at < 0:
        raise ParseError(f"unclosed '[' in {expr!r}")
    prefix, body, rest = expr[:open_at], expr[open_at + 1:close_at], expr[close_at + 1:]
    if "[" in body:
        raise ParseError(f"nested '[' in {expr!r}")
    tails = expand_one(rest)
    out = [prefix + item + tail for item in range_items(body, repr(expr)) for tail in tails]
    if len(out) > MAX_NAMES:
        raise ParseError(f"{expr!r} expands to too many names")
    return out


def expand(expr: str) -> List[str]:
    """A comma-separated hostlist (``a[1-2],b``) into every name, in order."""
    parts = (part.strip() for part in split_top(expr.strip()))
    return [name for part in parts if part for name in expand_one(part)]
