"""The Debian package, built with Debian's own tools (dpkg-buildpackage, dh-virtualenv) in a
Debian 13 root, installed with dpkg -i in a fresh one and used there as root, a job user
and nagios; dpkg -r leaves only the admin's config and the state, dpkg -P only the config."""
# ruff: noqa: F811  (dists comes from fleethelp)

import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest
from debian_root import fresh_root
from fleethelp import CONTRIB, dists  # noqa: F401
from nodeinstall import REPO, Node, make_wheelhouse, run, unpack_sdist

pytestmark = pytest.mark.node_install

BUILD_PACKAGES = ["python3", "python3-venv", "dh-virtualenv", "debhelper", "dpkg-dev",
                  "build-essential"]
NODE_PACKAGES = ["python3", "python3-venv"]
PER_JOB = "mps:\n  layout: per-job\n"
# dpkg's and apt's own records change with any dpkg -i; they are not ours.
BOOKKEEPING = ("/var/lib/dpkg", "/var/log/dpkg.log", "/var/log/apt", "/var/cache/debconf",
               "/var/log/alternatives.log")


UPGRADE_ENTRY = """mps-health (0.1.1) unstable; urgency=medium

  * A later version, to test upgrades.

 -- mps-health developers <mps-health@lists.example.org>  Wed, 02 Dec 2026 19:00:00 +0000

"""


@pytest.fixture(scope="module")
def debs(dists, tmp_path_factory) -> Iterator[Dict[str, Path]]:
    """contrib/debian built as docs/fleet.md says: the sdist, debian/ copied in, the wheel
    folder plus setuptools' wheel, dpkg-buildpackage -b in a Debian 13 root; and the same
    as version 0.1.1, to upgrade to."""
    base = tmp_path_factory.mktemp("debbuild")
    root = fresh_root(base / "root", BUILD_PACKAGES)
    src = unpack_sdist(dists.sdist, root / "build")
    wheels = make_wheelhouse(src)
    r = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--dest", str(wheels), "setuptools>=61"])
    assert r.returncode == 0, r.stderr[-2000:]
    shutil.copytree(src / "contrib" / "debian", src / "debian")
    newer = root / "build" / "mps-health-0.1.1"
    shutil.copytree(src, newer, symlinks=True)
    for name in ("pyproject.toml", "__init__.py"):
        text = (newer / name).read_text()
        (newer / name).write_text(text.replace('"0.1.0"', '"0.1.1"', 1))
    changelog = newer / "debian/changelog"
    changelog.write_text(UPGRADE_ENTRY + changelog.read_text())
    built: Dict[str, Path] = {}
    for tree in (src, newer):
        r = Node(root).sh(f"cd /build/{tree.name}\ndpkg-buildpackage -b -us -uc", timeout=600)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for version in ("0.1.0", "0.1.1"):
        [built[version]] = (root / "build").glob(f"mps-health_{version}_*.deb")
    yield built


@pytest.fixture
def deb(debs: Dict[str, Path]) -> Path:
    return debs["0.1.0"]


def test_deb_depends_and_contents(deb: Path) -> None:
    fields = run(["dpkg-deb", "-f", str(deb), "Depends", "Architecture"]).stdout
    assert "Depends: libc6" in fields and "python3.13" in fields, fields
    listing = run(["dpkg-deb", "-c", str(deb)]).stdout
    for path in ("./opt/mps-health/bin/python3 -> python3.13", "./usr/sbin/mps-health -> "
                 "/opt/mps-health/bin/mps-health", "./usr/lib/nagios/plugins/check_mps -> "
                 "/opt/mps-health/bin/check_mps", "./usr/lib/systemd/system/nvidia-mps.service",
                 "./usr/lib/systemd/system/nvidia-mps@.service",
                 "./usr/libexec/mps-health/mps-health-task-prolog",
                 "./usr/share/doc/mps-health/examples/config.example.yaml",
                 "/site-packages/pynvml.py",
                 "/site-packages/yaml/__init__.py", "/site-packages/mps_health/cli/main.py"):
        assert path in listing, path
    assert "./etc/mps-health/config.yaml" not in listing  # the defaults apply until you write one
    assert "/bin/activate" not in listing and "/site-packages/pip/" not in listing
    conffiles = run(["dpkg-deb", "-I", str(deb), "conffiles"])
    assert conffiles.returncode != 0 or "mps-health/config" not in conffiles.stdout


def test_deb_installs_runs_and_leaves_only_config_and_state(deb: Path, tmp_path: Path) -> None:
    node = Node(fresh_root(tmp_path / "root", NODE_PACKAGES))
    node.add_users()
    shutil.copy(deb, node.root / "root")
    shutil.copytree(REPO / "examples", node.root / "root/examples")
    before = node.files()
    out = node.ok(f"dpkg -i /root/{deb.name}")
    assert "Setting up mps-health (0.1.0)" in out

    assert node.ok("mps-health --version") == "mps-health 0.1.0\n"
    assert node.ok("command -v mps-health") == "/usr/sbin/mps-health\n"
    replay = node.sh("cd /root && mps-health check --replay examples/broken-node.json")
    # daemon-stale and pipe-dir-mode (the dead daemon's control-absent folded under it)
    assert replay.returncode == 2 and replay.stdout.startswith("MPS CRITICAL - 2 problems")
    plugin = node.sh("/usr/lib/nagios/plugins/check_mps -t 10", user="nagios")
    assert plugin.returncode == 2 and plugin.stdout.startswith("MPS CRITICAL - "), plugin
    assert node.ok("/usr/sbin/mps-health --version", user="alice") == "mps-health 0.1.0\n"
    # The packaged hooks (config: the default path): the TaskProlog, as the job's user,
    # reads the admin's config.
    (node.root / "etc/mps-health/config.yaml").write_text(PER_JOB)
    uid = node.uid("alice")
    node.ok("install -d -m 0700 -o alice -g alice /tmp/nvidia-mps_job9\nmps-health check || :")
    exports = node.sh("/usr/libexec/mps-health/mps-health-task-prolog", user="alice",
                      env={"SLURM_JOB_ID": "9", "SLURM_JOB_UID": uid, "SLURM_JOB_GPUS": "0"})
    assert exports.returncode == 0, exports
    assert exports.stdout == "export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps_job9\n"
    assert (node.root / "var/lib/mps-health").exists()

    node.ok("dpkg -r mps-health")
    after = node.files()
    # deb-systemd-helper remembers the units' enablement until the purge (Debian's way).
    kept = ("/etc/mps-health", "/var/lib/mps-health", "/var/log/mps-health",
            "/var/lib/systemd/deb-systemd-helper-", *BOOKKEEPING)
    assert sorted(p for p in set(after) - set(before) if not p.startswith(kept)) == []
    # No Debian package lists /opt (base-files makes it), so dpkg removes it, empty, with
    # the last package that shipped files there: the postrm puts the system's /opt back.
    gone = sorted(p for p in set(before) - set(after) if not p.startswith(BOOKKEEPING))
    assert gone == [], gone
    assert (node.root / "opt").is_dir() and not any((node.root / "opt").iterdir())
    assert "/etc/mps-health/config.yaml" in after
    assert any(p.startswith("/var/lib/mps-health/") for p in after)  # the state is kept

    node.ok("dpkg -P mps-health")
    purged = node.files()
    left = sorted(p for p in set(purged) - set(before) if not p.startswith(BOOKKEEPING))
    assert left == ["/etc/mps-health", "/etc/mps-health/config.yaml"]  # the admin's own file
    gone = sorted(p for p in set(before) - set(purged) if not p.startswith(BOOKKEEPING))
    assert gone == [], gone  # /opt, empty, stays
    assert (node.root / "opt").stat().st_mode & 0o7777 == 0o755


def test_remove_and_purge_leave_the_systems_empty_opt(tmp_path: Path) -> None:
    """The package's prerm and postrm, in a package of one file under /opt (no build
    needed), with a file Python would compile there at run time: dpkg takes an empty /opt
    with the last package listing it, at the remove or, left then, at the purge; the
    system's stays, 0755 root, whichever way the package goes."""
    tree = tmp_path / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: mps-health\nVersion: 0.1.0\nArchitecture: all\n"
        "Maintainer: test <test@example.org>\nDescription: the maintainer scripts alone\n")
    for script in ("prerm", "postrm"):
        text = (CONTRIB / f"debian/mps-health.{script}").read_text()
        (tree / "DEBIAN" / script).write_text(text.replace("#DEBHELPER#\n", ""))
        (tree / "DEBIAN" / script).chmod(0o755)
    (tree / "opt/mps-health").mkdir(parents=True)
    (tree / "opt/mps-health/file").write_text("x\n")
    r = run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(tmp_path / "m.deb")])
    assert r.returncode == 0, r.stderr
    node = Node(fresh_root(tmp_path / "root", NODE_PACKAGES))
    assert sorted(p.name for p in (node.root / "opt").iterdir()) == []
    shutil.copy(tmp_path / "m.deb", node.root / "root")
    compiled = "mkdir /opt/mps-health/__pycache__ && : > /opt/mps-health/__pycache__/m.pyc"
    for steps in (["dpkg -r", "dpkg -P"], ["dpkg -P"]):
        node.ok(f"dpkg -i /root/m.deb\n{compiled}")
        for step in steps:
            node.ok(f"{step} mps-health")
            opt = (node.root / "opt").lstat()
            assert stat.S_ISDIR(opt.st_mode) and stat.S_IMODE(opt.st_mode) == 0o755, step
            assert (opt.st_uid, opt.st_gid) == (0, 0) and not any((node.root / "opt").iterdir())


def test_deb_rules_are_the_files_the_test_builds() -> None:
    """contrib/debian is complete: dpkg-buildpackage needs control, rules (executable),
    changelog and source/format."""
    debian = CONTRIB / "debian"
    for name in ("control", "changelog", "source/format", "rules"):
        assert (debian / name).is_file(), name
    assert (debian / "rules").stat().st_mode & 0o111
    r = subprocess.run(["dpkg-parsechangelog", "-l", str(debian / "changelog"), "-S", "Version"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        assert r.stdout.strip() == "0.1.0"


def test_deb_upgrade_keeps_config_state_and_hooks(debs: Dict[str, Path], tmp_path: Path) -> None:
    """dpkg -i of a newer version over the old one: the config, the state and the hooks
    that `slurm install` wrote elsewhere are kept; rewritten, those hooks run as before."""
    node = Node(fresh_root(tmp_path / "root", NODE_PACKAGES))
    node.add_users()
    for version in debs:
        shutil.copy(debs[version], node.root / "root")
    node.ok(f"dpkg -i /root/{debs['0.1.0'].name}")
    (node.root / "etc/mps-health/config.yaml").write_text(PER_JOB)
    node.ok("mkdir -p /etc/slurm\nmps-health check || :\n"
            "mps-health slurm install --prefix /etc/slurm --config /etc/mps-health/config.yaml")
    state = node.root / "var/lib/mps-health"
    before = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    assert before, "mps-health check kept no state"

    out = node.ok(f"dpkg -i /root/{debs['0.1.1'].name}")
    assert "Unpacking mps-health (0.1.1) over (0.1.0)" in out
    assert node.ok("mps-health --version") == "mps-health 0.1.1\n"
    assert node.ok("/usr/sbin/mps-health --version", user="alice") == "mps-health 0.1.1\n"
    assert (node.root / "etc/mps-health/config.yaml").read_text() == PER_JOB
    after = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    assert after == before
    node.ok("mps-health slurm install --prefix /etc/slurm --config /etc/mps-health/config.yaml")
    uid = node.uid("alice")
    node.ok("install -d -m 0700 -o alice -g alice /tmp/nvidia-mps_job11")
    for hooks in ("/etc/slurm", "/usr/libexec/mps-health"):
        exports = node.sh(f"{hooks}/mps-health-task-prolog", user="alice",
                          env={"SLURM_JOB_ID": "11", "SLURM_JOB_UID": uid, "SLURM_JOB_GPUS": "0"})
        assert exports.stdout == "export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps_job11\n", hooks
    plugin = node.sh("/usr/lib/nagios/plugins/check_mps -V", user="nagios")
    assert plugin.returncode == 3 and "0.1.1" in plugin.stdout + plugin.stderr
