"""A dataset folder on disk: shards, manifest, lock, rank parts, telemetry; exactly-once resume.

    dataset_store.py  DatasetStore: the writer (claim, begin, write, commit, close)
    manifest.py       manifest.json (typed: Manifest), the run lock, the config-drift check
    layout.py         the folder's layout and the trust rules every reader follows
    shards.py         the shard file format and id sidecars
    ranks.py          several processes sharing a dataset: rank-<R>-of-<W>/ parts
    telemetry.py      telemetry.jsonl: a row per load poll
"""

from gen_pipeline.store.dataset_store import DatasetStore, ResumeState
from gen_pipeline.store.manifest import Manifest, ProgressRecord, RunRecord, read_manifest
from gen_pipeline.store.ranks import RankSpec, resolve_rank
from gen_pipeline.store.telemetry import Telemetry, TelemetryRow, read_telemetry

__all__ = ["DatasetStore", "Manifest", "ProgressRecord", "RankSpec", "ResumeState", "RunRecord", "Telemetry",
           "TelemetryRow", "read_manifest", "read_telemetry", "resolve_rank"]
