"""`validate` on real shard files: a clean dataset passes, each kind of problem is caught at file:line."""

from __future__ import annotations

import copy

import orjson
import pytest

from gen_pipeline.records import Sample
from gen_pipeline.reports.validate import validate_dataset
from gen_pipeline.store.dataset_store import DatasetStore

GOOD = {"id": "B2-0", "dataset": "B2",
        "conversations": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a", "reasoning_content": "r"}],
        "meta": {"model": "m", "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 7,
                 "sampling": {"temperature": 0.7}}}


def row(i: int, **change) -> dict:
    r = copy.deepcopy(GOOD)
    r["id"] = f"B2-{i}"
    for path, value in change.items():
        *parents, key = path.split("__")
        target = r
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if value is None:
            del target[int(key) if key.isdigit() else key]
        else:
            target[int(key) if key.isdigit() else key] = value
    return r


def write(folder, rows, name="shard-00000.jsonl"):
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" if isinstance(r, dict) else r for r in rows))


def test_a_store_written_dataset_is_clean(tmp_path):
    with DatasetStore(tmp_path, "B2", fingerprint={"truncated": "drop"}, target=9, shard_max_samples=4) as s:
        s.open()
        s.write_samples([Sample(r["id"], "B2", r["conversations"], r["meta"]) for r in (row(i) for i in range(9))])
    report = validate_dataset(tmp_path / "B2")
    assert (report.ok, report.rows, report.files, report.truncated, report.truncated_policy) == (True, 9, 3, 0, "drop")
    assert report.format().endswith(": 9 rows in 3 shards: OK (0 truncated, policy drop)")


CASES = [
    (b"not json\n", "unparseable", "not valid JSON"),
    (row(1, dataset=None), "schema", "missing dataset"),
    (row(1, id=7), "schema", "id is an integer here, a string in the first row"),
    (row(1, meta__prompt_tokens="5"), "meta_schema",
     "meta.prompt_tokens is a string here, an integer in the first row"),
    (row(1, meta__extra=1), "meta_schema", "extra meta.extra"),
    (row(1, meta__sampling__temperature=1), "meta_schema",
     "meta.sampling.temperature is an integer here, a float in the first row"),
    (row(1, conversations__2__reasoning_content=None), "reasoning_mixed",
     "conversations[2] lacks reasoning_content, unlike the first assistant turn of the dataset"),
    (row(0), "duplicate_id", "id 'B2-0' already at shard-00000.jsonl:1"),
    (row(1, conversations__1__role="system"), "roles", "roles are ['system', 'system', 'assistant']"),
    (row(1, conversations__2=None), "roles", "roles are ['system', 'user']"),
    (row(1, conversations__1__content="  "), "empty_content", "conversations[1] (user) has empty content"),
    (row(1, conversations__2__content="<think>hm</think>a"), "think_marker",
     "conversations[2].content contains '<think>'"),
    (row(1, conversations__1__content=["x"]), "schema", "conversations[1].content is not a string"),
]


@pytest.mark.parametrize(("bad", "kind", "message"), CASES, ids=[c[1] + "-" + c[2][:20] for c in CASES])
def test_each_problem_is_caught_with_file_and_line(tmp_path, bad, kind, message):
    write(tmp_path, [row(0), bad, row(2)])
    report = validate_dataset(tmp_path)
    assert not report.ok
    assert dict(report.counts) == {kind: 1}
    assert [str(p) for p in report.examples] == [f"shard-00000.jsonl:2: {message}"]
    assert f"  {kind}: 1 (" in report.format()


def test_truncated_is_counted_and_an_error_only_when_dropped(tmp_path):
    write(tmp_path, [row(0), row(1, meta__finish_reason="length")])
    keep = validate_dataset(tmp_path)
    assert (keep.ok, keep.truncated) == (True, 1)
    (tmp_path / "manifest.json").write_bytes(orjson.dumps({"fingerprint": {"truncated": "drop"}}))
    drop = validate_dataset(tmp_path)
    assert (drop.ok, drop.truncated, dict(drop.counts)) == (False, 1, {"truncated": 1})
    assert drop.to_dict()["examples"] == [{"kind": "truncated", "file": "shard-00000.jsonl", "line": 2,
                                           "message": 'finish_reason is "length" but generation.truncated = "drop"'}]


def test_duplicates_across_shards_and_examples_are_capped(tmp_path):
    write(tmp_path, [row(i) for i in range(30)])
    write(tmp_path, [row(i) for i in range(30)], name="shard-00001.jsonl")
    report = validate_dataset(tmp_path)
    assert dict(report.counts) == {"duplicate_id": 30}
    assert len(report.examples) == 20
    assert str(report.examples[0]) == "shard-00001.jsonl:1: id 'B2-0' already at shard-00000.jsonl:1"
