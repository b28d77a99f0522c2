import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"  # run_server uses anyio; the sim and httpx run on asyncio here
