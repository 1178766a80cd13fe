"""pytest plugin: a real one-node Slurm (``slurm_cluster``) for tests marked ``slurm``.

Every cluster fixture here runs once per Slurm: this machine's own (Debian 12: 22.05)
and Slurm 24.11 from a Debian 13 root (tests/helpers/slurmroot.py), the latter marked
``slurm24`` (``pytest -m slurm24`` runs those alone). ``slurm_where`` says which: None
for this machine's Slurm, else the started root, made once per session.

Registered in tests/conftest.py with ``pytest_plugins``. The session-scoped
``slurm_cluster`` is shared by every test that asks for it (they must leave the node
IDLE and their jobs cancelled: ``slurm_cluster.cancel_all()``); ``make_slurm_cluster``
starts a private one with other settings (HealthCheckProgram, Prolog, ...) and stops it
after the test. Both skip, with the reason, where slurm-wlm/munge are missing or we are
not root.
"""

import tempfile
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest
from slurmcluster import SlurmCluster, SlurmClusterError, ensure_user, skip_reason
from slurmroot import SlurmRoot, SlurmRootError, make_root, remove_root

# The Slurms every cluster fixture runs on: ids "host" (this machine's) and "slurm24".
SLURMS = [pytest.param("host", id="host"),
          pytest.param("slurm24", id="slurm24", marks=pytest.mark.slurm24)]


def _require(where: Optional[SlurmRoot] = None) -> None:
    reason = skip_reason() if where is None else None
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm24_root() -> Iterator[SlurmRoot]:
    """A fresh Debian 13 root with Slurm 24.11 and mps-health, started once per session."""
    from debian_root import cache_dir, usable

    why = usable()
    if why:
        pytest.skip(why)
    # Not under /tmp: the root sees this machine's /tmp at its own /tmp.
    dest = Path(tempfile.mkdtemp(prefix="debian13-slurm24-", dir="/var/tmp"))
    root = SlurmRoot(dest)
    try:
        root = make_root(dest, cache_dir())
        root.start()
    except SlurmRootError as e:
        remove_root(root)
        pytest.fail(f"could not prepare the Slurm 24.11 root: {e}", pytrace=False)
    except BaseException:
        remove_root(root)
        raise
    yield root
    remove_root(root)


@pytest.fixture(scope="session", params=SLURMS)
def slurm_where(request: pytest.FixtureRequest) -> Optional[SlurmRoot]:
    """None: this machine's Slurm; else the Debian 13 root whose Slurm 24.11 runs."""
    if request.param == "host":
        _require()
        return None
    return request.getfixturevalue("slurm24_root")


@pytest.fixture(scope="session")
def slurm_cluster(slurm_where: Optional[SlurmRoot]) -> Iterator[SlurmCluster]:
    """One node 'mpsnode', Gres=gpu:2,mps:200, IDLE; stopped by PID at the session's end."""
    cluster = SlurmCluster(root=slurm_where)
    try:
        cluster.start()
    except SlurmClusterError as e:
        pytest.fail(f"could not start the Slurm test cluster: {e}", pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture
def make_slurm_cluster(slurm_where: Optional[SlurmRoot]
                       ) -> Iterator[Callable[..., SlurmCluster]]:
    """Start a private cluster: ``make_slurm_cluster(health_check_program=..., ...)``."""
    started: List[SlurmCluster] = []

    def make(**settings: object) -> SlurmCluster:
        cluster = SlurmCluster(root=slurm_where, **settings)  # type: ignore[arg-type]
        started.append(cluster)
        try:
            return cluster.start()
        except SlurmClusterError as e:
            pytest.fail(f"could not start a Slurm test cluster: {e}", pytrace=False)

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_user() -> str:
    """An ordinary user for jobs (created with useradd if missing)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("creating a job user needs root")
    return ensure_user().pw_name
