"""A dataset folder on disk: shards, manifest, lock, rank parts, telemetry; exactly-once resume."""

from gen_pipeline.store.dataset_store import DatasetStore, ResumeState
from gen_pipeline.store.manifest import Manifest, ProgressRecord, RunRecord, read_manifest
from gen_pipeline.store.ranks import RankSpec, resolve_rank
from gen_pipeline.store.telemetry import Telemetry, TelemetryRow, read_telemetry

__all__ = ["DatasetStore", "Manifest", "ProgressRecord", "RankSpec", "ResumeState", "RunRecord", "Telemetry",
           "TelemetryRow", "read_manifest", "read_telemetry", "resolve_rank"]
