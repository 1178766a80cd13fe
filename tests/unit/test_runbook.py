"""Every code mps-health can report has a runbook entry (an anchor) in docs/runbook.md.

The codes are read from where they are declared: each check module's ``CODES``, the
engine's (facts-unavailable, check-failed) and the health check's (healthcheck-timeout).
A second look at the source keeps those declarations honest: every code literal a check
module passes to ``Result(...)`` must be in its ``CODES``.
"""

import importlib
import re
from pathlib import Path
from typing import Dict, Set

from conftest import REPO
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.healthcheck import run as healthcheck


def declared_by_check() -> Dict[str, Set[str]]:
    out: Dict[str, Set[str]] = {}
    for spec in registry.checks().values():
        module = spec.target.partition(":")[0]
        out[module] = set(importlib.import_module(module, "mps_health").CODES)
    return out


def declared() -> Set[str]:
    codes = set(engine.CODES) | set(healthcheck.CODES)
    for found in declared_by_check().values():
        codes |= found
    return codes


def literal_codes(text: str) -> Set[str]:
    """Codes written out in Result(NAME, STATE, "code", ...) calls and code tables."""
    codes = set()
    for m in re.finditer(r'Result\(\s*[\w.]+,\s*[^,]+?,\s*(f?)"([a-z0-9{}-]+)"', text):
        code = m.group(2)
        codes |= {code.replace("{role}", r) for r in ("pipe", "log")} if m.group(1) else {code}
    codes |= set(re.findall(r'^\s*"([a-z]+(?:-[a-z0-9]+)+)": \((?:OK|WARNING|CRITICAL|UNKNOWN)',
                            text, flags=re.M))
    codes.discard("ok")
    return codes


def anchors(path: Path) -> Set[str]:
    """The anchors a Markdown file has: its headings as GitHub makes them, its <a id>s."""
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)">', text))
    return found | {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S),
                                        flags=re.M)}


def test_every_code_has_a_runbook_anchor() -> None:
    anchors_ = anchors(REPO / "docs" / "runbook.md")
    codes = declared()
    assert len(codes) > 60
    assert {"daemon-restarted", "server-churn", "healthcheck-timeout"} <= codes
    missing = sorted(c for c in codes if c not in anchors_)
    assert missing == [], f"codes without a runbook entry in docs/runbook.md: {missing}"


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    """The runbook moved out of the README: every link between them still lands."""
    wrong = []
    for doc in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s:]+)\)", text):
            name, _, anchor = target.partition("#")
            dest = (doc.parent / name) if name else doc
            if not dest.exists() or (anchor and dest.suffix == ".md"
                                     and anchor not in anchors(dest)):
                wrong.append(f"{doc.name}: {target}")
    assert wrong == []


def test_check_modules_declare_every_code_they_report() -> None:
    for module, codes in declared_by_check().items():
        path = REPO / "checks" / (module.rsplit(".", 1)[-1] + ".py")
        undeclared = sorted(literal_codes(path.read_text()) - codes)
        assert undeclared == [], f"{module} reports codes missing from its CODES: {undeclared}"
    engine_text = (REPO / "engine" / "run.py").read_text()
    assert literal_codes(engine_text) <= set(engine.CODES)


def test_every_code_has_an_entry_that_explain_prints(capsys) -> None:
    """``mps-health explain CODE`` prints each code's entry from the docs/runbook.md the
    package carries: the one text, read as the installed package reads it."""
    from mps_health.cli import explain
    from mps_health.cli.main import main
    from mps_health.model import runbook

    assert set(explain.declared()) == declared()
    entries = runbook.entries()
    missing = sorted(c for c in declared() if c not in entries)
    assert missing == [], f"codes without an entry mps-health explain prints: {missing}"
    for code in sorted(declared()):
        assert main(["explain", code]) == 0
        out = capsys.readouterr().out
        assert code in out.split("\n", 1)[0], out  # its heading or row names it
        assert len(out.strip().splitlines()) >= 2 and "<a id" not in out, out
        assert entries[code].summary and "\n" not in entries[code].summary


def test_the_runbook_is_the_packages_own_docs_runbook() -> None:
    from mps_health.model import runbook

    # The installed package's own copy (a checkout's in an editable install).
    assert runbook.read_data(runbook.RUNBOOK) == (REPO / "docs" / "runbook.md").read_text()
    assert runbook.parse("# x\n\nno runbook here\n## y\ntext\n") == {}
    text = ("# Runbook\n\n## group\n\n### a-code\nFirst. [See](configuration.md#x).\n\n"
            "### t\n\n| code | state | meaning | what to do |\n|---|---|---|---|\n"
            "| <a id=\"b-code\"></a>`b-code` | WARNING | it is \\| odd | [fix](#a-code) |\n")
    found = runbook.parse(text)
    assert set(found) == {"a-code", "b-code", "t"}
    assert found["a-code"].text == "a-code\n\nFirst. See (docs/configuration.md)."
    assert found["b-code"].text == ("b-code (t check): WARNING\n\nit is | odd\n\n"
                                    "What to do: fix (mps-health explain a-code)")
    assert found["t"].group and not found["a-code"].group
