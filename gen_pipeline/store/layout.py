"""The dataset folder (docs/datasets.md) and its trust rules, read by the store, status, validate and export
alike; nothing here writes. A folder's *parts* (itself, or its rank-<R>-of-<W>/ folders) are read as one dataset.

Trust rules: every complete line that is a JSON object with a string "id" is a sample, also past the manifest's
committed length (the manifest lags by design); bytes after the last newline, and an invalid last line, are a torn
write; an invalid line before the last is damage; a sealed shard whose size equals its manifest record is trusted
without parsing (`ShardFile.record`: figures from the record, ids from the sidecar).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.display import display_path
from gen_pipeline.errors import StoreError
from gen_pipeline.store.lock import LOCK_NAME
from gen_pipeline.store.manifest import MANIFEST_NAME, Manifest, ShardRecord, check_drift, read_manifest
from gen_pipeline.store.ranks import RankSpec, parse_rank_folder
from gen_pipeline.store.shards import ShardScan, iter_lines, list_shards, read_sidecar, scan_bytes, sidecar_path

ERRORS_NAME = "errors.jsonl"
REJECTS_NAME = "rejects.jsonl"


def dataset_folder(root: Path, dataset: str) -> Path:
    return Path(root) / dataset


def part_folder(root: Path, dataset: str, spec: RankSpec) -> Path:
    """Where one run writes: the dataset folder itself (world size 1) or its rank-<R>-of-<W>/ folder."""
    folder = dataset_folder(root, dataset)
    return folder / spec.folder_name if spec.ranked else folder


def rank_parts(folder: Path) -> dict[tuple[int, int], Path]:
    """{(rank, world): its folder} of the rank folders in a dataset folder, ordered by world, then rank."""
    try:
        found = [(rw, p) for p in Path(folder).iterdir() if (rw := parse_rank_folder(p.name)) and p.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {rw: p for rw, p in sorted(found, key=lambda x: (x[0][1], x[0][0]))}


def _has_own_output(folder: Path) -> bool:
    """The folder itself (not its rank folders) holds a manifest, a lock or shards: a one-run dataset."""
    return any((Path(folder) / name).exists() for name in (MANIFEST_NAME, LOCK_NAME)) or bool(list_shards(folder))


def dataset_parts(folder: Path) -> list[Path]:
    """The parts of a dataset: the folder itself, or its rank folders (both when a folder mixes them: hide nothing)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    ranks = list(rank_parts(folder).values())
    return ([folder] if not ranks or _has_own_output(folder) else []) + ranks


def part_name(folder: Path, path: Path) -> str:
    """`path` as named in messages about a dataset: relative to the dataset folder (rank-1-of-4/shard-...)."""
    try:
        return str(Path(path).relative_to(folder))
    except ValueError:
        return Path(path).name


def has_shards(folder: Path) -> bool:
    """True when any part of the folder has a shard file (empty or not)."""
    return any(list_shards(part) for part in dataset_parts(folder))


def has_samples(folder: Path) -> bool:
    """True when any shard of any part holds bytes (what makes config drift matter)."""
    return any(p.stat().st_size for part in dataset_parts(folder) for p in list_shards(part).values())


def _samples(parts: list[Path]) -> int:
    return sum(s.samples for part in parts for s in committed_shards(part, ids=False))


def check_world(folder: Path, spec: RankSpec) -> None:
    """Raise StoreError (what exists, what was asked, what to do) when a run's layout differs from the folder's: ranks
    over a one-run dataset, the reverse, or another world size. Any rank folder counts, even an empty one."""
    where = display_path(folder)
    others = {rw: p for rw, p in rank_parts(folder).items() if rw[1] != spec.world}
    env = spec.source not in ("default", "--rank/--world-size")  # say which variables, when they decided
    asked = (f"this run is {spec.label}" + (f" (from {spec.source})" if env else "") if spec.ranked
             else "this run has no rank (world size 1" + (f", from {spec.source})" if env else ")"))
    redo = f"or write to another --output-dir or dataset name (or move {where} away to start over)."
    if spec.ranked and _has_own_output(folder):
        raise StoreError(
            f"{where} holds a dataset written by one run without ranks ({_samples([folder]):,} samples in its own "
            f"shards); {asked}. One dataset cannot mix the two layouts. Finish it without ranks (no --rank/--world-size"
            ", outside a SLURM job array or multi-task srun, RANK/WORLD_SIZE unset), " + redo)
    if others:
        worlds = sorted({w for _, w in others})
        n = _samples(list(others.values()))
        empty = " (no samples yet: delete those folders to start over with this world size)" if n == 0 else ""
        keep = " or ".join(str(w) for w in worlds)
        how = (f"Submit the job array as --array=0-{worlds[0] - 1} (world size {keep})"
               if spec.source.startswith("SLURM_ARRAY") else
               f"Run every rank with --world-size {keep} (ranks 0 to {worlds[0] - 1})")
        raise StoreError(
            f"{where} was written with world size {keep} ({', '.join(p.name for p in others.values())}: {n:,} "
            f"samples){empty}; {asked}. Which rank owns a prompt depends on the world size, so changing it would "
            f"redo or lose samples. {how} to continue, " + redo)


def check_other_ranks(folder: Path, spec: RankSpec, fingerprint: dict[str, Any]) -> None:
    """Raise ConfigDriftError when another rank of `folder` wrote samples with a different config."""
    for (rank, _), part in rank_parts(folder).items():
        theirs = (read_manifest(part)[0] or {}).get("fingerprint")
        if rank != spec.rank and theirs is not None and theirs != fingerprint and has_samples(part):
            check_drift(part, theirs, fingerprint)


def sealed_records(manifest: Manifest | None) -> dict[str, ShardRecord]:
    """{shard name: its record} of the shards the manifest lists as sealed."""
    return {e["name"]: e for e in (manifest or {}).get("sealed", [])}


@dataclass(frozen=True)
class ShardFile:
    """One shard file of a part and the manifest's record of it (None: not listed as sealed)."""

    index: int
    path: Path
    size: int
    listed_record: ShardRecord | None

    @property
    def record(self) -> ShardRecord | None:
        """The manifest's record when the file still matches it (same size: the trust rule), else None."""
        return self.listed_record if self.listed_record and self.listed_record.get("bytes") == self.size else None


def shard_files(folder: Path, manifest: Manifest | None = None) -> list[ShardFile]:
    """A part's shards in index order with their manifest records (read if not given); one that vanishes is left out."""
    records = sealed_records(read_manifest(folder)[0] if manifest is None else manifest)
    out = []
    for index, path in list_shards(folder).items():
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        out.append(ShardFile(index, path, size, records.get(path.name)))
    return out


@dataclass
class CommittedShard:
    """The committed samples of one shard: figures, ids (when asked for), damaged lines (`scan.corrupt`)."""

    file: ShardFile
    scan: ShardScan
    samples: int
    parsed: bool  # False = figures from the manifest record (and ids from the sidecar)


def committed_shard(shard: ShardFile, *, ids: bool = True) -> CommittedShard:
    """One shard under the trust rule (`ids=False`: figures only, no sidecar read when trusted); raises OSError."""
    rec = shard.record
    if rec is not None:
        found = read_sidecar(sidecar_path(shard.path), shard.path, shard.size) if ids else []
        if found is not None and (not ids or len(found) == rec["samples"]):
            scan = ShardScan(ids=found, good_bytes=shard.size, prompt_tokens=rec["prompt_tokens"],
                             completion_tokens=rec["completion_tokens"], truncated=rec["truncated"],
                             gate=dict(rec.get("gate") or {}), variants=dict(rec.get("variants", {})))
            return CommittedShard(shard, scan, rec["samples"], parsed=False)
    scan = scan_bytes(shard.path.read_bytes())
    return CommittedShard(shard, scan, scan.samples, parsed=True)


def committed_shards(folder: Path, *, ids: bool = True) -> list[CommittedShard]:
    """Every shard of every part of a dataset folder with its committed figures (and ids)."""
    out = []
    for shard in (s for part in dataset_parts(folder) for s in shard_files(part)):
        with contextlib.suppress(OSError):  # vanished or rewritten while we read: a live run owns it
            out.append(committed_shard(shard, ids=ids))
    return out


def iter_committed_samples(folder: Path, duplicates: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """A dataset's committed samples (every part), the first of each id; raises StoreError on a damaged line. The id
    of each later line with an id already met (damage: the store never writes an id twice) goes to `duplicates`."""
    seen: set[str] = set()
    for shard in (s for part in dataset_parts(folder) for s in shard_files(part)):
        data = shard.path.read_bytes()  # one snapshot; a live writer only appends after it
        for number, row, _why, _end in iter_lines(data):
            if row is None:
                raise StoreError(f"{display_path(shard.path)} line {number} is not a sample, and it is not the last "
                                 "line, so this is not a torn write: the file is damaged. Run `gen-pipeline validate` "
                                 "on the dataset, fix or delete that line, then export again.")
            if row["id"] not in seen:
                seen.add(row["id"])
                yield row
            elif duplicates is not None:
                duplicates.append(row["id"])


def read_jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON object lines of a file (a torn or unparseable line is skipped); [] when absent."""
    try:
        return jsonl_rows(Path(path).read_bytes())
    except FileNotFoundError:
        return []


def jsonl_rows(data: bytes) -> list[dict[str, Any]]:
    """The JSON object lines of `data` (a torn or unparseable line is skipped)."""
    rows = []
    for line in data.split(b"\n"):
        with contextlib.suppress(orjson.JSONDecodeError):
            rows.append(orjson.loads(line))
    return [row for row in rows if isinstance(row, dict)]


def final_failure_ids(folder: Path) -> set[str]:
    """Ids recorded in errors.jsonl with `retryable: false` (done or not), over all parts."""
    return {r["id"] for part in dataset_parts(folder) for r in read_jsonl_rows(part / ERRORS_NAME)
            if r.get("retryable") is False and isinstance(r.get("id"), str)}


def rejected_rows(folder: Path) -> set[int]:
    """Source rows already recorded in one part's rejects.jsonl."""
    rows = set()
    for r in read_jsonl_rows(Path(folder) / REJECTS_NAME):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rows.add(int(r["row"]))
    return rows
