import pytest

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.http import open_http


@pytest.fixture
async def http():
    async with open_http(GenerationConfig(), 16) as session:
        yield session
