"""The dataset-folder layer: which shard lines are committed samples, read the same way by the store,
status, validate and export (through iter_committed_samples / committed_shards)."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest
from store_helpers import crash

from gen_pipeline.errors import StoreError
from gen_pipeline.records import Failure, Sample
from gen_pipeline.reports.status import read_status
from gen_pipeline.store.dataset_store import DatasetStore
from gen_pipeline.store.layout import (
    committed_shards,
    dataset_parts,
    final_failure_ids,
    iter_committed_samples,
    read_jsonl_rows,
    shard_files,
)

PKG = Path(__file__).resolve().parents[2] / "gen_pipeline"


def sample(i: int) -> Sample:
    return Sample(f"D-{i}", "D", [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
                  {"finish_reason": "length" if i % 4 == 0 else "stop", "prompt_tokens": 10, "completion_tokens": i})


def crashed_folder(root: Path) -> Path:
    """2 sealed shards, an open one with 2 committed + 1 flushed-only line, then a torn write."""
    s = DatasetStore(root, "D", fingerprint={"model": "m"}, target=100, shard_max_samples=4, fsync_every=1000)
    s.open()
    s.write_samples([sample(i) for i in range(10)])
    s.commit()
    s.write_samples([sample(10)])  # flushed, not committed: still a sample
    s.write_failures([Failure("D-50", "D", "http_400", "too long", retryable=False),
                      Failure("D-3", "D", "timeout", "x")])
    crash(s)  # the process dies here
    with open(root / "D" / "shard-00002.jsonl", "ab") as f:
        f.write(b'{"id": "D-99", "conv')  # torn
    return root / "D"


def test_committed_samples_are_every_whole_line_and_not_the_torn_tail(tmp_path: Path) -> None:
    folder = crashed_folder(tmp_path)
    rows = list(iter_committed_samples(folder))
    assert [r["id"] for r in rows] == [f"D-{i}" for i in range(11)]
    assert rows[3] == orjson.loads(sample(3).to_json())
    shards = committed_shards(folder)
    assert [(c.file.path.name, c.parsed, c.scan.samples) for c in shards] == [
        ("shard-00000.jsonl", False, 4), ("shard-00001.jsonl", False, 4), ("shard-00002.jsonl", True, 3)]
    assert sum(c.scan.truncated for c in shards) == 3 and sum(c.scan.completion_tokens for c in shards) == 55
    assert shards[2].scan.cut_bytes == len(b'{"id": "D-99", "conv')
    assert final_failure_ids(folder) == {"D-50"}
    assert dataset_parts(tmp_path / "absent") == [] and dataset_parts(folder) == [folder]  # one part today
    assert [r["id"] for r in read_jsonl_rows(folder / "errors.jsonl")] == ["D-50", "D-3"]
    # status and a resuming store count exactly these
    assert read_status(tmp_path, "D", 100).done == 11
    with DatasetStore(tmp_path, "D", fingerprint={"model": "m"}, target=100, shard_max_samples=4) as s:
        assert s.open().done == 11


def test_a_sealed_shard_that_no_longer_matches_its_record_is_parsed(tmp_path: Path) -> None:
    folder = crashed_folder(tmp_path)
    first = folder / "shard-00000.jsonl"
    first.write_bytes(first.read_bytes().split(b"\n", 1)[1])  # lost its first line: size differs
    files = shard_files(folder)
    assert [(f.index, f.record is None, f.listed_record is not None) for f in files] == [
        (0, True, True), (1, False, True), (2, True, False)]
    shards = committed_shards(folder)
    assert (shards[0].parsed, shards[0].scan.ids) == (True, ["D-1", "D-2", "D-3"])
    assert [r["id"] for r in iter_committed_samples(folder)][:3] == ["D-1", "D-2", "D-3"]
    assert read_status(tmp_path, "D", 100).done == 10


def test_a_damaged_line_mid_shard_is_not_a_sample(tmp_path: Path) -> None:
    folder = crashed_folder(tmp_path)
    open_shard = folder / "shard-00002.jsonl"
    lines = open_shard.read_bytes().split(b"\n")
    lines[0] = b"garbage"
    open_shard.write_bytes(b"\n".join(lines))
    with pytest.raises(StoreError) as e:  # the readers of samples (export) refuse damage, as resume does
        list(iter_committed_samples(folder))
    assert str(e.value) == (f"{open_shard} line 1 is not a sample, and it is not the last line, so this is not a "
                            "torn write: the file is damaged. Run `gen-pipeline validate` on the dataset, fix or "
                            "delete that line, then export again.")
    assert committed_shards(folder)[2].scan.corrupt == [(1, "not valid JSON")]


def test_the_writer_does_not_import_the_readers() -> None:
    """store/dataset_store.py (the writer) reads the folder through layout.py, never through a report or export."""
    tree = ast.parse((PKG / "store" / "dataset_store.py").read_text())
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {m for m in imported if m.startswith(("gen_pipeline.reports", "gen_pipeline.export"))} == set()
    assert "gen_pipeline.store.layout" in imported
