"""Shared fixtures. The Hugging Face hub is unreachable here: datasets runs offline on local files."""

from __future__ import annotations

import os
import tempfile

# Set before `datasets` is imported anywhere: offline, and a cache that does not pollute ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="gen-pipeline-hf-"))
# The suite may run inside an srun task or a torchrun job: the CLI subprocesses must not become ranks.
for _var in ("SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"):
    os.environ.pop(_var, None)

import pytest  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
