"""pytest plugin: a real one-node Slurm (``slurm_cluster``) for tests marked ``slurm``.

Registered in tests/conftest.py with ``pytest_plugins``. The session-scoped
``slurm_cluster`` is shared by every test that asks for it (they must leave the node
IDLE and their jobs cancelled: ``slurm_cluster.cancel_all()``); ``make_slurm_cluster``
starts a private one with other settings (HealthCheckProgram, Prolog, ...) and stops it
after the test. Both skip, with the reason, where slurm-wlm/munge are missing or we are
not root.
"""

from typing import Callable, Iterator, List

import pytest
from slurmcluster import SlurmCluster, SlurmClusterError, ensure_user, skip_reason


def _require() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One node 'mpsnode', Gres=gpu:2,mps:200, IDLE; stopped by PID at the session's end."""
    _require()
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmClusterError as e:
        pytest.fail(f"could not start the Slurm test cluster: {e}", pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture
def make_slurm_cluster() -> Iterator[Callable[..., SlurmCluster]]:
    """Start a private cluster: ``make_slurm_cluster(health_check_program=..., ...)``."""
    _require()
    started: List[SlurmCluster] = []

    def make(**settings: object) -> SlurmCluster:
        cluster = SlurmCluster(**settings)  # type: ignore[arg-type]
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
    _require()
    return ensure_user().pw_name
