import logging

import pytest

from rose.config import ClusterConfig, EngineConfig


@pytest.fixture(scope="session")
def cluster():
    """One real LocalRoseCluster (scheduler + trainer + dedicated worker processes) for the session."""
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), EngineConfig()) as c, Client(c) as client:
        yield client
