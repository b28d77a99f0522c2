"""gen_pipeline: regenerate prompt datasets with a target model on SGLang into EAGLE-3
(SpecForge) training data. The CLI is `gen-pipeline` (gen_pipeline.cli); the library does the work
and refuses what the CLI refuses, with the same messages:

    import anyio
    from gen_pipeline import RunOptions, find_dataset_config, run_generate
    summary = anyio.run(run_generate, find_dataset_config("B2"), RunOptions(server_urls=("http://gpu:30000",)))

Several datasets through one server: `run_job(find_dataset_configs(["B1,B2"]), opts)`; `generate`'s
flags → RunOptions: `run_options(cfgs, limit=..., ...)`. Read-only: `status_all`, `validate_dataset`,
`run_check`, `run_export`.

Logging: the library only emits records (under the `gen_pipeline` logger; a dataset's carry its name
in `record.dataset`; `gen_pipeline.journal` is a run's record: its start, the controller's decisions,
how it ended). It shows nothing unless you configure logging, e.g.:

    import logging
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    anyio.run(run_generate, cfg, opts)

A progress display is an observer: `RunOptions(on_progress=gen_pipeline.run.Progress().update)`.
Heavy modules (datasets, the server package) load on first use, so `status` stays fast.
"""

from __future__ import annotations

from typing import Any

from gen_pipeline.config import (
    DatasetConfig,
    ServerProfile,
    find_dataset_config,
    find_dataset_configs,
    load_dataset_config,
    load_server_profile,
)
from gen_pipeline.errors import (
    ConfigDriftError,
    ConfigError,
    DiskError,
    GenPipelineError,
    LockedError,
    RequestError,
    ServerError,
    ServerStartupError,
    SourceShortError,
    StoreError,
)
from gen_pipeline.records import Capacity, Failure, LoadSnapshot, Prompt, Reject, RunSnapshot, Sample

# imported on first use: the run pulls anyio, the HTTP client and the server package
_RUN = ("Job", "JobSummary", "Progress", "RunOptions", "RunSummary", "open_job", "run_generate", "run_job",
        "run_options")
_REPORTS = ("diagnose_dataset", "run_check", "status_all", "validate_dataset")
_EXPORT = ("ExportOptions", "run_export")
_PROBE = ("ProbeOptions", "run_probe")

__all__ = [
    "Capacity", "ConfigDriftError", "ConfigError", "DatasetConfig", "DiskError", "Failure", "GenPipelineError",
    "LoadSnapshot", "LockedError", "Prompt", "Reject", "RequestError", "RunSnapshot", "Sample", "ServerError",
    "ServerProfile", "ServerStartupError", "SourceShortError", "StoreError", "find_dataset_config",
    "find_dataset_configs", "load_dataset_config", "load_server_profile", *_RUN, *_REPORTS, *_EXPORT, *_PROBE,
]


def __getattr__(name: str) -> Any:
    if name in _RUN:
        from gen_pipeline import run
        return getattr(run, name)
    if name in _REPORTS:
        from gen_pipeline import reports
        return getattr(reports, name)
    if name in _EXPORT:
        from gen_pipeline import export
        return getattr(export, name)
    if name in _PROBE:
        from gen_pipeline import probe
        return getattr(probe, name)
    raise AttributeError(f"module 'gen_pipeline' has no attribute {name!r}")
