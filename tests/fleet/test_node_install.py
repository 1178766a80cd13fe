"""The README's "Install on a node", run as written on a fresh Debian 13 (debootstrap
minbase with only python3 and python3-venv): root, a job user (the TaskProlog runs as
the job's user) and nagios each run what they need; a virtualenv under /root is refused
by `slurm install`; an upgrade keeps the state and rewrites the hooks; an uninstall
leaves only the config and the state."""
# ruff: noqa: F811  (dists comes from fleethelp)

import shutil
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from debian_root import fresh_root
from fleethelp import dists  # noqa: F401
from nodeinstall import (
    README,
    REPO,
    Node,
    bumped_wheel,
    make_wheelhouse,
    readme_block,
    unpack_sdist,
)

pytestmark = pytest.mark.node_install

BASE_PACKAGES = ["python3", "python3-venv"]
WHEELS = "/root/wheels"
HOOKS = "/etc/slurm"
PER_JOB = "mps:\n  layout: per-job\n"


@pytest.fixture(scope="module")
def source(dists, tmp_path_factory) -> Iterator[Tuple[Path, Path]]:
    """The unpacked sdist (what an admin downloads) and its wheel folder for Python 3.13."""
    src = unpack_sdist(dists.sdist, tmp_path_factory.mktemp("sdist"))
    yield src, make_wheelhouse(src)


@pytest.fixture
def node(tmp_path: Path, source) -> Node:
    """A fresh Debian 13 node with the wheel folder in /root/wheels and two users."""
    root = fresh_root(tmp_path / "root", BASE_PACKAGES)
    shutil.copytree(source[1], root / WHEELS.lstrip("/"))
    shutil.copytree(REPO / "examples", root / "root/examples")
    n = Node(root)
    n.add_users()
    return n


def install(node: Node) -> str:
    return node.ok(readme_block("node-install"), env={"WHEELS": WHEELS})


def test_readme_install_serves_root_job_users_and_nagios(node: Node) -> None:
    out = install(node)
    assert out.strip().splitlines()[-1] == "mps-health 0.1.0"
    venv = node.root / "opt/mps-health"
    assert (venv.stat().st_mode & 0o777, venv.stat().st_uid) == (0o755, 0)
    assert node.ok("python3 --version").startswith("Python 3.13")

    # root: the README's replay example, word for word, and the real node (no MPS here).
    replay = node.sh("cd /root && mps-health check --replay examples/broken-node.json")
    assert replay.returncode == 2
    text = README.read_text()
    example = text[text.index("$ mps-health check --replay examples/broken-node.json\n"):]
    first, second = example.splitlines()[1:3]
    assert replay.stdout.splitlines()[0] == first
    assert replay.stdout.splitlines()[1].startswith(second.removesuffix("..."))
    real = node.sh("mps-health check")
    assert real.returncode == 2 and real.stdout.startswith("MPS CRITICAL - ")
    # The root has no NVIDIA driver: the check leads with that cause, not with a reset.
    assert "mps-not-installed node" in real.stdout.splitlines()[0], real.stdout
    # The commands are the entry points pip wrote into the venv; root's runs write
    # nothing into the package but Python's own .pyc files, and the next run says the same.
    for command in ("mps-health", "mps-health-healthcheck", "check_mps"):
        wrapper = (venv / "bin" / command).read_text()
        assert wrapper.startswith("#!/opt/mps-health/bin/python3\n"), wrapper
        assert "import main" in wrapper or "import healthcheck_main" in wrapper, wrapper
    package = next(venv.glob("lib/python3*/site-packages/mps_health"))
    kept = [p.name for p in package.rglob("__pycache__/*") if p.suffix != ".pyc"]
    assert kept == [], kept
    assert not (node.root / "run/mps-health/config.json").exists()
    again = node.sh("mps-health check")
    assert (again.returncode, again.stdout.splitlines()[0]) == (2, real.stdout.splitlines()[0])

    # nagios: the plugin from the plugin dir, in Nagios's own format, never a traceback.
    plugin = node.sh("/usr/local/lib/nagios/plugins/check_mps -t 10", user="nagios")
    assert plugin.returncode == 2 and plugin.stdout.startswith("MPS CRITICAL - "), plugin
    assert "Traceback" not in plugin.stdout + plugin.stderr
    assert node.sh("/usr/local/lib/nagios/plugins/check_mps -V", user="nagios").returncode == 3

    # The Slurm hooks, for the virtualenv's Python: root runs the Prolog and Epilog, the
    # job's user the TaskProlog, which reads the config and prints the job's pipe dir.
    node.ok(f"mkdir -p {HOOKS} /etc/mps-health")
    (node.root / "etc/mps-health/config.yaml").write_text(PER_JOB)
    (node.root / "etc/mps-health/config.yaml").chmod(0o644)
    hooks = node.ok(f"mps-health slurm install --prefix {HOOKS}")
    assert f"TaskProlog={HOOKS}/mps-health-task-prolog" in hooks
    prolog = (node.root / HOOKS.lstrip("/") / "mps-health-prolog").read_text()
    assert prolog.startswith("#!/opt/mps-health/bin/python3 -I\n")
    node.ok(f"{HOOKS}/mps-health-prolog && {HOOKS}/mps-health-epilog")  # no GPU: at once
    uid = node.uid("alice")
    node.ok("install -d -m 0700 -o alice -g alice /tmp/nvidia-mps_job7")
    exports = node.sh(f"{HOOKS}/mps-health-task-prolog", user="alice",
                      env={"SLURM_JOB_ID": "7", "SLURM_JOB_UID": uid, "SLURM_JOB_GPUS": "0"})
    assert exports.returncode == 0, exports
    assert exports.stdout == "export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps_job7\n"
    # The job's user can run the commands too (nothing under the venv is root's only).
    assert node.ok("/usr/local/sbin/mps-health --version", user="alice") == "mps-health 0.1.0\n"


def test_a_venv_under_root_is_refused_by_slurm_install(node: Node) -> None:
    """The natural mistake: a virtualenv in root's home. Root can use it; job users and
    nagios cannot, and `slurm install` says so in one line and writes nothing."""
    node.ok(f"python3 -m venv /root/venv\n"
            f"/root/venv/bin/pip install -q --no-index --find-links {WHEELS} mps-health\n"
            f"mkdir -p {HOOKS} /etc/mps-health")
    # The per-job layout's hooks (the node layout's own daemons need none).
    (node.root / "etc/mps-health/config.yaml").write_text(PER_JOB)
    (node.root / "etc/mps-health/config.yaml").chmod(0o644)
    r = node.sh(f"/root/venv/bin/mps-health slurm install --prefix {HOOKS}")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r
    assert r.stderr.startswith("mps-health: install: job users cannot use the interpreter "
                               "/root/venv/bin/python3: /root is mode 0700; the TaskProlog "
                               "runs as the job's user"), r.stderr
    assert list((node.root / HOOKS.lstrip("/")).iterdir()) == []
    # Why: the job's user really cannot start it (the shell's 126).
    denied = node.sh("/root/venv/bin/mps-health --version", user="alice")
    assert denied.returncode == 126 and "Permission denied" in denied.stderr


def test_upgrade_keeps_state_and_rewrites_hooks(node: Node, source, tmp_path: Path) -> None:
    install(node)
    # The hooks are the per-job layout's (`slurm install` writes none for the node's own
    # daemons); the state comes from a check of the default, node layout.
    node.ok(f"mkdir -p {HOOKS} /etc/mps-health")
    (node.root / "etc/mps-health/config.yaml").write_text(PER_JOB)
    (node.root / "etc/mps-health/config.yaml").chmod(0o644)
    (node.root / "root/node.yaml").write_text("mps:\n  layout: node\n")
    node.ok(f"mps-health slurm install --prefix {HOOKS}\n"
            "mps-health check --config /root/node.yaml || :")
    state = node.root / "var/lib/mps-health"
    before = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    assert before, "mps-health check kept no state"
    hook = node.root / HOOKS.lstrip("/") / "mps-health-task-prolog"
    old_inode = hook.stat().st_ino

    new = tmp_path / "new-wheels"
    shutil.copytree(source[1], new)
    for old in new.glob("mps_health-0.1.0-*.whl"):
        old.unlink()
    shutil.copy(bumped_wheel(source[0], "0.1.1", tmp_path), new)
    shutil.copytree(new, node.root / "root/wheels-0.1.1")
    node.ok(readme_block("upgrade"), env={"WHEELS": "/root/wheels-0.1.1", "HOOKS": HOOKS})

    assert node.ok("mps-health --version") == "mps-health 0.1.1\n"
    assert node.ok("/usr/local/sbin/mps-health --version", user="alice") == "mps-health 0.1.1\n"
    plugin = node.sh("/usr/local/lib/nagios/plugins/check_mps -V", user="nagios")
    assert plugin.returncode == 3 and "0.1.1" in plugin.stdout + plugin.stderr
    after = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    assert after == before
    assert hook.stat().st_ino != old_inode  # written anew (temporary name, then renamed)
    assert hook.read_text().startswith("#!/opt/mps-health/bin/python3 -I\n")
    r = node.sh(f"{HOOKS}/mps-health-task-prolog", user="alice",
                env={"SLURM_JOB_ID": "8", "SLURM_JOB_GPUS": "0"})
    assert r.returncode == 0 and r.stdout == ""  # job 8 has no dir: nothing to export


def test_uninstall_leaves_only_config_and_state(node: Node) -> None:
    # Slurm's config dir, and systemd's /etc/tmpfiles.d (a minbase root has no systemd).
    node.ok(f"mkdir -p {HOOKS} /etc/tmpfiles.d")
    before = node.files()
    install(node)
    node.ok("mkdir -p /etc/mps-health\nprintf 'budget_s: 10\\n' > /etc/mps-health/config.yaml\n"
            f"mps-health slurm install --prefix {HOOKS}\nmps-health check || :\n"
            "mps-health remediate tmpfiles-guard\n"
            "mps-health remediate drain --dry-run || :")
    node.ok("/usr/local/lib/nagios/plugins/check_mps || :", user="nagios")
    installed = node.files()
    assert "/opt/mps-health/bin/python3" in installed
    assert "/etc/tmpfiles.d/mps-health.conf" in installed
    node.ok(readme_block("uninstall"), env={"HOOKS": HOOKS})
    after = node.files()
    kept = ("/etc/mps-health", "/var/lib/mps-health", "/var/log/mps-health")
    added = sorted(p for p in set(after) - set(before) if not p.startswith(kept))
    assert added == []
    assert sorted(set(before) - set(after)) == []
    assert "/etc/mps-health/config.yaml" in after and "/var/lib/mps-health" in after
