"""The real Slurm cluster for tests/slurm/: started once per session, stopped (every daemon and job) at the end."""
import pytest

from tests.support.slurm import SlurmCluster, missing_reason


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running two-node cluster (n1, n2 on this host); skips with the reason where it cannot start."""
    if reason := missing_reason():
        pytest.skip(reason)
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()
