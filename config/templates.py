"""The pipe/log dir templates (``mps.pipe_dir``, ``mps.log_dir``): ``{gpu}`` and ``{job}``.

The one expansion, matcher and glob, so the dirs the Prolog makes are exactly those the
checks, remediation, the Epilog and the tmpfiles guard find. Where the fields may stand is
checked at load; their values here, on every expansion: a job id is digits, a GPU an index
or a UUID (letters, digits, '-'), so a value can never add a path component.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple

DIGITS = frozenset("0123456789")
GPU_CHARS = DIGITS | frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_FIELD = {"job": r"(?P<job>[0-9]+)", "gpu": r"(?P<gpu>[0-9A-Za-z-]+?)"}


class TemplateError(ValueError):
    """A field value that would not make a plain path component."""


def expand(template: str, job: str = "", gpu: str = "") -> str:
    """``template`` with ``{job}`` and ``{gpu}`` filled in (empty where not used)."""
    for name, value, chars in (("job", job, DIGITS), ("gpu", gpu, GPU_CHARS)):
        if f"{{{name}}}" in template and not (value and set(value) <= chars):
            raise TemplateError(f"{name} {value!r} is not a valid {{{name}}} value for "
                                f"{template}")
    return template.format(job=job, gpu=gpu)


def pattern(template: str) -> re.Pattern[str]:
    """A regex for the last component of a per-job template (groups ``job``, ``gpu``);
    fields read as ``str.format`` reads them (which ``expand`` uses)."""
    import string  # only for a template (per-gpu, per-job): string compiles a regex at import

    out = ""
    for literal, field, spec, conversion in string.Formatter().parse(os.path.basename(template)):
        out += re.escape(literal)
        if field:
            if field not in _FIELD or spec or conversion:
                raise TemplateError(f"unknown field {{{field}}} in {template!r}")
            out += _FIELD[field]
    return re.compile(out + r"\Z")


def match(template: str, name: str) -> Optional[Tuple[str, str]]:
    """(job, gpu) of a dir name that fits the template's last component; None if not."""
    m = pattern(template).match(name)
    return None if m is None else (m.group("job"), m.groupdict().get("gpu") or "")


def glob(template: str) -> str:
    """The template as a glob, for tmpfiles.d (every field becomes ``*``)."""
    import string  # as in pattern

    return "".join(literal + ("*" if field else "")
                   for literal, field, _, _ in string.Formatter().parse(template))
