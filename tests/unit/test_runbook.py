"""Every code a check can report has a runbook entry (an anchor) in README.md."""

import re

from conftest import REPO


def emitted_codes() -> set:
    codes = set()
    for path in [*(REPO / "checks").glob("*.py"), REPO / "core" / "engine.py"]:
        text = path.read_text()
        # Result(CHECK, STATE, "code", ...) and Result(..., f"{role}-dir-...", ...)
        for m in re.finditer(r'Result\(\s*[\w.]+,\s*[^,]+?,\s*(f?)"([a-z0-9{}-]+)"', text):
            code = m.group(2)
            if m.group(1):
                codes |= {code.replace("{role}", role) for role in ("pipe", "log")}
            else:
                codes.add(code)
        # tables of codes: "code": (STATE, ...
        codes |= set(re.findall(r'^\s*"([a-z]+(?:-[a-z0-9]+)+)": \((?:OK|WARNING|CRITICAL|UNKNOWN)',
                                text, flags=re.M))
    codes.discard("ok")
    return codes


def test_every_code_has_a_readme_anchor() -> None:
    readme = (REPO / "README.md").read_text()
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)">', readme))
    anchors |= {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", readme, flags=re.M)}
    codes = emitted_codes()
    assert len(codes) > 60
    missing = sorted(c for c in codes if c not in anchors)
    assert missing == [], f"codes without a runbook entry in README.md: {missing}"
