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
Every module loads on first use, so `status` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from gen_pipeline.export import ExportOptions, run_export
    from gen_pipeline.probe import ProbeOptions, run_probe
    from gen_pipeline.records import Capacity, Failure, LoadSnapshot, Prompt, Reject, RunSnapshot, Sample
    from gen_pipeline.reports import diagnose_dataset, run_check, status_all, validate_dataset
    from gen_pipeline.run import (
        Job,
        JobSummary,
        Progress,
        RunOptions,
        RunSummary,
        open_job,
        run_generate,
        run_job,
        run_options,
    )

# Every name loads on first use: `import gen_pipeline` costs nothing, so the CLI holds the signals
# (gen_pipeline/signals.py) before any heavy import, and `status` stays fast.
_CONFIG = ("DatasetConfig", "ServerProfile", "find_dataset_config", "find_dataset_configs", "load_dataset_config",
           "load_server_profile")
_ERRORS = ("ConfigDriftError", "ConfigError", "DiskError", "GenPipelineError", "LockedError", "RequestError",
           "ServerError", "ServerStartupError", "SourceShortError", "StoreError")
_RECORDS = ("Capacity", "Failure", "LoadSnapshot", "Prompt", "Reject", "RunSnapshot", "Sample")
_RUN = ("Job", "JobSummary", "Progress", "RunOptions", "RunSummary", "open_job", "run_generate", "run_job",
        "run_options")
_REPORTS = ("diagnose_dataset", "run_check", "status_all", "validate_dataset")
_EXPORT = ("ExportOptions", "run_export")
_PROBE = ("ProbeOptions", "run_probe")
_HOMES = {**dict.fromkeys(_CONFIG, "config"), **dict.fromkeys(_ERRORS, "errors"),
          **dict.fromkeys(_RECORDS, "records"), **dict.fromkeys(_RUN, "run"), **dict.fromkeys(_REPORTS, "reports"),
          **dict.fromkeys(_EXPORT, "export"), **dict.fromkeys(_PROBE, "probe")}

__all__ = [
    "Capacity", "ConfigDriftError", "ConfigError", "DatasetConfig", "DiskError", "ExportOptions", "Failure",
    "GenPipelineError", "Job", "JobSummary", "LoadSnapshot", "LockedError", "ProbeOptions", "Progress", "Prompt",
    "Reject", "RequestError", "RunOptions", "RunSnapshot", "RunSummary", "Sample", "ServerError", "ServerProfile",
    "ServerStartupError", "SourceShortError", "StoreError", "diagnose_dataset", "find_dataset_config",
    "find_dataset_configs", "load_dataset_config", "load_server_profile", "open_job", "run_check", "run_export",
    "run_generate", "run_job", "run_options", "run_probe", "status_all", "validate_dataset",
]
assert sorted(__all__) == sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gen_pipeline' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"gen_pipeline.{home}"), name)
