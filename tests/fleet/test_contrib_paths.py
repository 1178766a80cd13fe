"""Every absolute path contrib/ names is one something puts there: the README's install
blocks, the .deb or the RPM, mps-health itself (its defaults: the config it reads, the
dirs it makes, the files it writes), or another program this file names with why. A
definition naming a path no install makes (a plugin in /usr/lib/nagios/plugins after an
install by hand into /usr/local/lib/nagios/plugins) fails here."""

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, Set

from conftest import REPO
from mps_health.config.load import DEFAULT_PATH, from_mapping
from mps_health.config.remediation import REMEDIATION
from mps_health.remediation.tmpfiles_guard import GUARD_FILE
from nodeinstall import readme_block

CONTRIB = REPO / "contrib"
# The packages' own definitions: they are where package paths come from, read below.
PACKAGING = ("debian", "rpm")
ROOTS = ("usr", "etc", "opt", "var", "run", "srv", "sbin", "bin", "lib", "lib64", "tmp")
PATH_RE = re.compile(r"(?<![\w.$}/~-])/(?:" + "|".join(ROOTS) + r")(?:/[\w.@%*{}+-]+)*/?")

# Not ours to install, each with why contrib names it.
OTHERS: Dict[str, str] = {
    "/var/log": "the MPS log dirs' parent",
    "/etc/nhc/nhc.conf": "LBNL NHC's own config, which names the shim's check",
    "/etc/nhc/scripts/mps_health.nhc": "NHC reads checks from its scripts dir only: the site "
    "copies the shim there (docs/fleet.md); the packages ship it in /usr/share/mps-health",
    "/var/lib/prometheus/node-exporter": "Debian's node_exporter textfile collector dir",
    "/opt/site/bin/canary": "an example of a site's own canary (commands.mps-health-canary)",
    "/var/cache/mps-health/wheels": "where the Ansible role copies the wheel folder",
}


def contrib_paths() -> Dict[str, Set[str]]:
    """Each absolute path contrib/ names (outside the packages' definitions) -> files."""
    found: Dict[str, Set[str]] = {}
    for path in sorted(CONTRIB.rglob("*")):
        rel = path.relative_to(CONTRIB)
        if not path.is_file() or rel.parts[0] in PACKAGING:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for m in PATH_RE.finditer(text):
            named = m.group(0).rstrip("/.")
            if named.count("/") > 1:  # a bare /etc or /tmp names no one's file
                found.setdefault(named, set()).add(str(rel))
    return found


def _block_installs(block: str) -> Iterator[str]:
    """Where a README shell block puts things: mkdir -p, ln -sf's targets, the venv."""
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["mkdir", "-p"]:
            yield from words[2:]
        elif words[:3] == ["python3", "-m", "venv"]:
            yield words[3]
        elif words[:2] == ["ln", "-sf"]:
            *sources, target = words[2:]
            if target.endswith("/"):
                yield from (target + PurePosixPath(s).name for s in sources)
            else:
                yield target


def readme_installs() -> Set[str]:
    """The install block's places, and where the README's commands write a file the
    package carries (``mps-health contrib NAME > /etc/systemd/system/...``)."""
    readme = (REPO / "README.md").read_text()
    written = re.findall(r"mps-health (?:contrib|config example)[^`>]*>\s*(/[^\s`]+)",
                         readme)
    return set(_block_installs(readme_block("node-install"))) | set(written)


def package_installs() -> Set[str]:
    """Where the .deb and the RPM put files. Accepted: contrib's definitions name these for
    nodes installed from the packages (check_mps in the distribution's plugin dir, the
    commands in /usr/sbin, the units in /usr/lib/systemd/system)."""
    deb = CONTRIB / "debian"
    out = {"/opt/mps-health"}  # dh-virtualenv's and the spec's virtualenv
    for line in (deb / "mps-health.install").read_text().splitlines():
        source, dest = line.split()
        out.add(f"/{dest}/{PurePosixPath(source).name}")
    for line in (deb / "mps-health.links").read_text().splitlines():
        out.add("/" + line.split()[1])
    out |= {"/" + line.strip() for line in (deb / "mps-health.dirs").read_text().splitlines()
            if line.strip()}
    spec = (CONTRIB / "rpm/mps-health.spec").read_text()
    macros = dict(re.findall(r"^%global (\w+) (/\S+)$", spec, re.M))
    files = spec.split("%files", 1)[1].split("%changelog", 1)[0]
    for line in files.splitlines():
        word = line.split()[-1] if line.split() else ""
        for name, value in macros.items():
            word = word.replace(f"%{{{name}}}", value)
        if word.startswith("/"):
            out.add(word)
    return out


def own_defaults() -> Set[str]:
    """What mps-health itself reads, makes or writes where the config says nothing, and
    the NVIDIA driver's MPS binaries where it looks for them (the units run them)."""
    config = from_mapping({}, None)
    layouts = [from_mapping({"mps": {"layout": layout}}, None).mps
               for layout in ("node", "per-gpu", "per-job")]
    return {DEFAULT_PATH, config.state_dir, config.run_dir, GUARD_FILE,
            config.get(REMEDIATION).audit_log,
            # The MPS binaries it looks for (not anything else in those dirs).
            *(f"{d}/{name}" for d in config.mps.binary_dirs
              for name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")),
            *(m.pipe_dir for m in layouts), *(m.log_dir for m in layouts)}


def pattern(path: str) -> str:
    """A path with its templates and globs as one wildcard: the config's ``{gpu}`` and
    ``{job}``, a unit's ``%i``, a tmpfiles or NHC glob ``*``."""
    return re.sub(r"(\{\w+\}|%i|\*)+", "*", path).rstrip("/")


def accepted(path: str, places: Set[str]) -> bool:
    """``path`` is a place, under one (a file in an installed dir), or the dir an install
    puts one in; templates and globs compared as such (``/tmp/nvidia-mps_%i`` is the
    per-gpu default ``/tmp/nvidia-mps_{gpu}``)."""
    named = pattern(path)
    for place in map(pattern, places):
        if named == place or named.startswith(place + "/") or place.startswith(named + "/"):
            return True
    return False


def test_every_path_contrib_names_is_one_an_install_puts_there() -> None:
    places = readme_installs() | package_installs() | own_defaults() | set(OTHERS)
    wrong = {p: sorted(files) for p, files in contrib_paths().items()
             if not accepted(p, places)}
    assert wrong == {}, f"named in contrib/ but put there by no install: {wrong}"


def test_the_by_hand_install_is_what_contrib_names_first() -> None:
    """The README's install puts the plugin, the commands and the units' documentation
    where contrib's definitions name them by default."""
    installs = readme_installs()
    for path in ("/usr/local/lib/nagios/plugins/check_mps", "/usr/local/sbin/mps-health",
                 "/usr/local/sbin/mps-health-healthcheck", "/opt/mps-health/README.md"):
        assert path in installs, path
    named = contrib_paths()
    assert "/usr/local/lib/nagios/plugins/check_mps" in named
    assert "/opt/mps-health/README.md" in named


def test_a_path_no_install_makes_fails(tmp_path: Path) -> None:
    places = readme_installs() | package_installs() | own_defaults() | set(OTHERS)
    assert not accepted("/usr/local/bin/check_mps", places)
    assert not accepted("/usr/share/mps-health/check_mps", places)
    assert not accepted("/etc/nagios/mps-health.cfg", places)
    assert accepted("/usr/lib/nagios/plugins/check_mps", places)  # the .deb's
    assert accepted("/tmp/nvidia-mps_{gpu}", places)  # the per-gpu default's template
