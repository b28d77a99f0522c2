"""gen_pipeline: regenerate prompt datasets with a target model on SGLang into EAGLE-3
(SpecForge) training data. The CLI is `gen-pipeline` (gen_pipeline.cli); the library:

    from gen_pipeline import find_dataset_config, RunOptions, run_generate
    summary = anyio.run(run_generate, find_dataset_config("B2"), RunOptions(server_urls=("http://gpu:30000",)))

Heavy modules (datasets, the server package) load on first use, so `status` stays fast.
"""

from __future__ import annotations

from typing import Any

from gen_pipeline.config.dataset import DatasetConfig, find_dataset_config, load_dataset_config
from gen_pipeline.errors import (
    ConfigDriftError,
    ConfigError,
    DiskError,
    GenPipelineError,
    LockedError,
    RequestError,
    ServerError,
    ServerStartupError,
    StoreError,
)
from gen_pipeline.records import Capacity, Failure, LoadSnapshot, Prompt, Reject, Sample

__all__ = [
    "Capacity", "ConfigDriftError", "ConfigError", "DatasetConfig", "DiskError", "Failure", "GenPipelineError",
    "LoadSnapshot", "LockedError", "Prompt", "Reject", "RequestError", "RunOptions", "RunSummary", "Sample",
    "ServerError", "ServerStartupError", "StoreError", "find_dataset_config", "load_dataset_config", "run_generate",
]


def __getattr__(name: str) -> Any:
    if name in ("RunOptions", "RunSummary", "run_generate"):
        from gen_pipeline.run import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module 'gen_pipeline' has no attribute {name!r}")
