"""The one rule for text taken from the system before any output shows it.

File names in world-writable dirs, environments, command output and log lines are
written by whoever wants to: a newline would forge an output line ("OK daemon[node]: all
good"), an ANSI or OSC escape would reach a terminal or a Nagios status line.
``printable`` writes every non-printable character (controls, line and paragraph
separators, bidi overrides) as a Python-style ``\\xNN``/``\\uNNNN`` escape. The engine
applies it to every result; the audit log and drain reasons again to their own fields.
``escape`` quotes a value inside a message: backslashes doubled, cut to a length.
"""


def _escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (one line, no terminal codes)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def lines(text: str) -> str:
    """Several lines of output (a plan, a diff), each made printable: the line breaks are
    ours, anything else a value brought in is escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))


def escape(text: str, limit: int = 120) -> str:
    """``text`` quoted exactly (``\\`` for a backslash, escapes as above), cut to ``limit``."""
    shown = printable(text.replace("\\", "\\\\"))
    return shown if len(shown) <= limit else shown[: max(0, limit - 3)] + "..."
