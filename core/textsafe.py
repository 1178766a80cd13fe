"""Text taken from users' processes (command lines, environment values), made safe to print.

Anything a user controls may hold terminal escapes, newlines (a forged second problem
line for NHC or slurmd's drain reason) or invalid UTF-8. ``escape`` keeps printable
characters and writes every other one as ``\\xNN``/``\\uNNNN``, cut to ``limit``.
"""


def escape(text: str, limit: int = 120) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    shown = "".join(out)
    return shown if len(shown) <= limit else shown[: max(0, limit - 3)] + "..."
