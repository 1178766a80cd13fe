"""A strict parser of the Nagios plugin output grammar, for tests.

The rules are those Nagios 4 and Icinga 2 rely on (Nagios plugin API; monitoring-plugins
development guidelines; nagiosplugin 1.4.0 as seen here):

* the first line is ``[SERVICE ]STATE[ - |: ]text[|perfdata]``; STATE matches the exit
  code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN); the text holds no '|';
* perfdata is space-separated ``'label'=value[UOM];[warn];[crit];[min];[max]``: a label
  without '=' (quoted if it has spaces or quotes, quotes doubled), a plain decimal value
  (no exponent) or ``U``, a UOM of none, s, ms, us, %, B, KB, MB, GB, TB, c, thresholds
  in range syntax (``10``, ``10:``, ``~:10``, ``10:20``, ``@10:20``), min and max plain
  decimals; trailing empty fields may be left out;
* more lines are long output; a '|' there starts more perfdata, parsed the same way;
* everything fits in Nagios 4's 8 KiB.
"""

import re
from typing import List, NamedTuple, Optional

STATES = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}
UOMS = {"", "s", "ms", "us", "%", "B", "KB", "MB", "GB", "TB", "c"}
MAX_BYTES = 8192
_NUM = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
NUMBER = re.compile(rf"{_NUM}\Z")
RANGE = re.compile(rf"@?(?:(?:~|{_NUM})?:)?(?:{_NUM})?\Z")
FIRST = re.compile(r"(?:(?P<service>[^|\s][^|]*?) )?(?P<state>OK|WARNING|CRITICAL|UNKNOWN)"
                   r"(?P<sep> - |: )(?P<text>[^|]*)(?:\|(?P<perf>.*))?\Z")
VALUE = re.compile(rf"(?P<value>{_NUM}|U)(?P<uom>[A-Za-z%]*)\Z")
TOKEN = re.compile(r"'(?:[^']|'')+'=\S*|[^\s']\S*")


class GrammarError(AssertionError):
    pass


class Perf(NamedTuple):
    label: str
    value: str
    uom: str
    warn: str
    crit: str
    min: str
    max: str


class PluginOutput(NamedTuple):
    service: Optional[str]
    state: str
    separator: str
    text: str
    perfdata: List[Perf]
    long_lines: List[str]
    more_perfdata: List[Perf]  # perfdata given after a '|' in the long output

    def perf(self, label: str) -> Perf:
        found = [p for p in self.perfdata + self.more_perfdata if p.label == label]
        if len(found) != 1:
            raise KeyError(f"{label!r} appears {len(found)} times in the perfdata")
        return found[0]


def parse_perfdata(text: str) -> List[Perf]:
    items: List[Perf] = []
    rest = text.strip()
    tokens = TOKEN.findall(rest)
    if TOKEN.sub("", rest).strip():
        raise GrammarError(f"perfdata has stray characters: {rest!r}")
    for token in tokens:
        label, eq, fields = token.rpartition("=") if token.startswith("'") else \
            token.partition("=")
        if not eq or not label:
            raise GrammarError(f"perfdata item {token!r} has no label=value")
        if label.startswith("'"):
            if not (label.endswith("'") and len(label) >= 3):
                raise GrammarError(f"badly quoted label in {token!r}")
            label = label[1:-1].replace("''", "'")
        elif "'" in label or "=" in label:
            raise GrammarError(f"label {label!r} needs quoting")
        parts = fields.split(";")
        if len(parts) > 5:
            raise GrammarError(f"perfdata item {token!r} has more than 5 fields")
        parts += [""] * (5 - len(parts))
        m = VALUE.match(parts[0])
        if m is None:
            raise GrammarError(f"value {parts[0]!r} of {label!r} is not a plain decimal "
                               "with a unit")
        if m.group("uom") not in UOMS:
            raise GrammarError(f"unit {m.group('uom')!r} of {label!r} is not one of the "
                               "plugin API's units")
        for name, field in (("warn", parts[1]), ("crit", parts[2])):
            if field and not RANGE.match(field):
                raise GrammarError(f"{name} {field!r} of {label!r} is not a range")
        for name, field in (("min", parts[3]), ("max", parts[4])):
            if field and not NUMBER.match(field):
                raise GrammarError(f"{name} {field!r} of {label!r} is not a plain decimal")
        items.append(Perf(label, m.group("value"), m.group("uom"), *parts[1:5]))
    return items


def parse(output: str, exit_code: int) -> PluginOutput:
    """Parse ``output`` strictly; GrammarError names the first rule it breaks."""
    if len(output.encode()) >= MAX_BYTES:
        raise GrammarError(f"output is {len(output.encode())} bytes, Nagios keeps 8 KiB")
    if not output.strip():
        raise GrammarError("no output")
    lines = output.rstrip("\n").split("\n")
    m = FIRST.match(lines[0])
    if m is None:
        raise GrammarError(f"first line is not 'SERVICE STATE - text | perfdata': {lines[0]!r}")
    if STATES.get(exit_code) != m.group("state"):
        raise GrammarError(f"state {m.group('state')} does not match exit code {exit_code}")
    perfdata = parse_perfdata(m.group("perf")) if m.group("perf") is not None else []
    long_lines: List[str] = []
    more: List[Perf] = []
    in_perf = False
    for line in lines[1:]:
        if in_perf:
            more += parse_perfdata(line)
            continue
        text, bar, perf = line.partition("|")
        long_lines.append(text)
        if bar:
            in_perf = True
            more += parse_perfdata(perf)
    return PluginOutput(m.group("service"), m.group("state"), m.group("sep"),
                        m.group("text"), perfdata, long_lines, more)
