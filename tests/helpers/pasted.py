"""What an operator pastes: the commands printed text quotes (``'mps-health ...'``), found
as a reader finds them, so a test runs exactly what the tool printed (the tool itself
never reads a command back out of text: a result carries its argv)."""

from typing import List

START = "'mps-health "


def commands(text: str) -> List[str]:
    """The commands ``text`` quotes, each a shell command line. A word in it may be quoted
    (``--config '/etc/my site.yaml'``): a quote ends the command only where no such word
    opens (after a space or a closing double quote) and none closed just before
    (``shlex.quote`` never writes two single quotes in a row)."""
    found: List[str] = []
    at = 0
    while True:
        start = text.find(START, at)
        if start < 0:
            return found
        i, inside, before = start + 1, "", " "
        while i < len(text):
            c = text[i]
            if inside:
                if c == inside:
                    inside, before = "", "closed" + c
                else:
                    before = c
            elif c == "'" and before not in (" ", 'closed"'):
                break  # the command's own closing quote
            elif c in "'\"":
                inside = c
            else:
                before = c
            i += 1
        found.append(text[start + 1:i])
        at = i + 1
