"""Shared fixtures. The Hugging Face hub is unreachable here: datasets runs offline on local files."""

from __future__ import annotations

import os
import tempfile

# Set before `datasets` is imported anywhere: offline, and a cache that does not pollute ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="gen-pipeline-hf-"))

import pytest  # noqa: E402

# tests/contract runs SGLang's own code in its own venv (`make contract`), not in `make test`.
collect_ignore = [] if os.environ.get("GEN_PIPELINE_CONTRACT") == "1" else ["contract"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
