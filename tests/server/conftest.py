import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"  # run_server uses anyio; the sim and aiohttp run on asyncio here
