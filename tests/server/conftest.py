import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"  # run_server uses anyio; the sim (uvicorn) runs on asyncio here
