"""bench/: each script backs a claim the README or docs make, and the peer bench runs.

The scripts are measured by hand (their figures are in the docs); what is tested here
is that each is named where its claim is made, that DEVELOPING.md's Benchmarks table
lists every one, and that bench/peer_nhc.py starts and skips cleanly without NHC. No
timing is asserted.
"""

import re
import subprocess
import sys
from pathlib import Path

from paths import REPO

BENCH = REPO / "bench"
PEER = BENCH / "peer_nhc.py"
DEVELOPING = REPO / "docs" / "DEVELOPING.md"
def benchmarks_section() -> str:
    text = DEVELOPING.read_text()
    start = text.index("\n## Benchmarks\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def claims_outside_benchmarks() -> str:
    """README.md and docs/*.md, without the Benchmarks section that lists the scripts."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in docs)
    return text.replace(benchmarks_section(), "")


def scripts() -> list:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_bench_script_backs_a_claim_in_the_readme_or_docs() -> None:
    claims = claims_outside_benchmarks()
    unclaimed = [name for name in scripts()
                 if f"bench/{name}" not in claims]
    assert unclaimed == [], f"bench scripts that back no claim in README.md or docs/: {unclaimed}"


def test_the_benchmarks_section_lists_every_script_and_only_those() -> None:
    listed = set(re.findall(r"`bench/([\w.]+\.py)", benchmarks_section()))
    assert listed == set(scripts())


def run_peer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PEER), *args], capture_output=True, text=True,
                          timeout=60)


def test_peer_nhc_help_runs() -> None:
    r = run_peer("--help")
    assert r.returncode == 0, r.stderr
    assert "--nhc" in r.stdout and "--python" in r.stdout and "--rounds" in r.stdout
    assert r.stderr == ""


def test_peer_nhc_without_nhc_skips_in_one_line() -> None:
    r = run_peer()
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("peer_nhc: skipped: no --nhc DIR")
    assert "https://github.com/mej/nhc" in lines[0] and "1.4.3" in lines[0]


def test_peer_nhc_with_a_dir_that_is_not_nhc_skips_in_one_line(tmp_path: Path) -> None:
    r = run_peer("--nhc", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith(f"peer_nhc: skipped: {tmp_path} is not an NHC checkout (no nhc)")
