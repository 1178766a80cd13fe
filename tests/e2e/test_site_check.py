"""A site's own check module, named in the config, runs like a built-in."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
from nodesite import Site

SITE_CHECK = '''
"""A site check: the pipe dir's mode, judged against the site's own section."""

from mps_health.engine import registry
from mps_health.model.results import OK, WARNING, Result
from mps_health.config.schema import Record, Section, whole


class SiteModeConfig(Record):
    expected_mode: int = whole(0o777, low=0, high=0o7777)


SECTION = Section("site_mode", SiteModeConfig)
SECTIONS = (SECTION,)


def check(facts, config):
    want = config.get(SECTION).expected_mode
    for inst in facts.instances:
        d = facts.sources["dirs"][inst.pipe_dir]  # path -> DirFact (lstat)
        if d.mode == want:
            yield Result("site-mode", OK, "ok", inst.name, f"mode {d.mode:o}",
                         values=(("mode", float(d.mode)),))
        else:
            yield Result("site-mode", WARNING, "site-mode-differs", inst.name,
                         f"mode {d.mode:o}, the site wants {want:o}", "chmod it",
                         (("mode", float(d.mode)),))


registry.check("site-mode", "site_pkg.mode_check:check", ("dirs",),
               summary="the pipe dir has the site's mode")
'''


def site_tree(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "site_pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mode_check.py").write_text(SITE_CHECK)
    (pkg / "broken.py").write_text("import no_such_package_here\n")
    (pkg / "silent.py").write_text("X = 1\n")
    (pkg / "clash.py").write_text(
        "from mps_health.engine import registry\n"
        "registry.check('daemon', f'{__name__}:check', ('dirs',))\n")
    return tmp_path / "site"


def run(site: Site, config: str, *args: str) -> subprocess.CompletedProcess:
    site.dirs()
    path = site.config(config)
    env: Dict[str, str] = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(site_tree(site.root)), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "mps_health.cli.main", *args, "--config",
                           str(path)], capture_output=True, text=True, timeout=60, env=env)


def test_site_check_runs_like_a_builtin(site: Site) -> None:
    config = "checks:\n  modules: [site_pkg.mode_check]\n  only: [site-mode]\n"
    r = run(site, config + "site_mode:\n  expected_mode: 448\n", "check",
            "--format", "json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    (problem,) = report["problems"]
    assert (problem["check"], problem["code"], problem["instance"]) == \
        ("site-mode", "site-mode-differs", "node")
    assert problem["message"] == "mode 777, the site wants 700"
    ok = run(site, config, "check", "-v")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK site-mode[node]: mode 777" in ok.stdout.splitlines()
    # its own section is validated with the rest of the file
    bad = run(site, config + "site_mode:\n  expected: 1\n", "check")
    assert (bad.returncode, bad.stdout) == (3, "")
    assert "key 'site_mode.expected': unknown key (known here: expected_mode)" in bad.stderr


def test_site_check_is_on_by_default_and_in_the_metrics(tmp_path: Path, site: Site) -> None:
    r = run(site, "checks:\n  modules: [site_pkg.mode_check]\n", "exporter",
            "--textfile", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert 'check="site-mode"' in (tmp_path / "mps_health.prom").read_text()


@pytest.mark.private_pids  # every default check, strays (the whole node) included
def test_site_check_runs_after_the_built_ins(site: Site) -> None:
    """It gives no order: the built-ins keep theirs, whichever was imported first."""
    r = run(site, "checks:\n  modules: [site_pkg.mode_check]\n", "check", "--format", "json")
    names = [c["name"] for c in json.loads(r.stdout)["checks"]]
    assert names == ["daemon", "strays", "control", "blockers", "directories", "tmpfiles",
                     "servers", "limits", "logs", "site-mode"], r.stderr


def test_a_module_that_cannot_be_imported_is_one_line(site: Site) -> None:
    for module, why in (
            ("site_pkg.nope", "cannot import 'site_pkg.nope': ModuleNotFoundError: No module "
                              "named 'site_pkg.nope'"),
            ("site_pkg.broken", "cannot import 'site_pkg.broken': ModuleNotFoundError: No "
                                "module named 'no_such_package_here'"),
            ("site_pkg.silent", "'site_pkg.silent' declares no check"),
            # a built-in's name is taken, whether or not the built-ins were loaded yet
            ("site_pkg.clash", "ValueError: check 'daemon' is already declared by "
                               ".checks.daemon:check"),
            ("site-pkg", "must be Python module names")):
        r = run(site, f"checks:\n  modules: [{module}]\n", "check", "--only", "daemon")
        assert (r.returncode, r.stdout) == (3, ""), module
        assert r.stderr.startswith(f"mps-health: {site.root}/config.yaml: key 'checks.modules':")
        assert why in r.stderr and r.stderr.count("\n") == 1, r.stderr
