import pytest


@pytest.fixture(scope="module")
def sim_url(shared_sim):  # tests/servers.py: one simulator per worker
    return shared_sim.url
