"""gen_pipeline: regenerate prompt datasets with a target model on SGLang into EAGLE-3 (SpecForge) training
data. The CLI is `gen-pipeline`; the library refuses what it refuses, with the same messages:

    summary = anyio.run(run_generate, find_dataset_config("B2"), RunOptions(server_urls=("http://gpu:30000",)))

It emits log records under the `gen_pipeline` logger only and shows nothing until you configure logging.
"""

from __future__ import annotations

import importlib
from typing import Any

# Every name loads on first use: `import gen_pipeline` costs nothing, so the CLI holds the signals
# (gen_pipeline/signals.py) before any heavy import, and `status` stays fast.
_EXPORTS = {
    "config": ("DatasetConfig", "ServerProfile", "find_dataset_config", "find_dataset_configs",
               "load_dataset_config", "load_server_profile"),
    "errors": ("ConfigDriftError", "ConfigError", "DiskError", "GenPipelineError", "LockedError", "RequestError",
               "ServerError", "ServerStartupError", "SourceShortError", "StoreError"),
    "records": ("Capacity", "Failure", "LoadSnapshot", "Prompt", "Reject", "RunSnapshot", "Sample"),
    "run": ("Job", "JobSummary", "Progress", "RunOptions", "RunSummary", "open_job", "run_generate", "run_job",
            "run_options"),
    "reports": ("diagnose_dataset", "run_check", "status_all", "validate_dataset"),
    "export": ("ExportOptions", "run_export"),
    "probe": ("ProbeOptions", "run_probe"),
}
_HOMES = {name: home for home, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gen_pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gen_pipeline.{home}"), name)
