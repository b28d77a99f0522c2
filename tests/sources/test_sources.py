"""Sources: the real `datasets` library on local files in the three schemas; invalid rows are
rejected with a reason, never fatal; ids are stable; done ids are skipped."""

from pathlib import Path

import orjson
import pytest

from gen_pipeline.config.dataset import DatasetConfig, SourceConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.records import Reject
from gen_pipeline.sources.loading import SourceStats, iter_prompts


def cfg_for(path: Path, **source) -> DatasetConfig:
    return DatasetConfig(name="T", target_samples=10, source=SourceConfig(files=(str(path),), **source))


def run(cfg: DatasetConfig, skip=frozenset()):
    stats, rejects = SourceStats(), []
    prompts = list(iter_prompts(cfg, skip, stats, rejects))
    return prompts, stats, rejects


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "old"},
                                  {"from": "human", "value": "more"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q"}]},
    {"id": "c", "conversations": [{"from": "human", "value": 5}]},
    {"id": "d", "conversations": [{"from": "gpt", "value": "first"}]},
    {"id": "e", "conversations": [{"from": "human", "value": "  "}]},
    {"id": "f", "conversations": "not a list"},
    {"id": "g", "conversations": [{"from": "human"}]},
    {"id": "a", "conversations": [{"from": "human", "value": "dup id"}]},
    {"id": "h", "conversations": [{"from": "narrator", "value": "x"}]},
    {"id": "i", "text": "no conversations column in this row"},
]


def test_sharegpt_jsonl_valid_rows_and_reasons(tmp_path: Path) -> None:
    cfg = cfg_for(write_jsonl(tmp_path / "s.jsonl", SHAREGPT), schema="sharegpt", field="conversations",
                  id_field="id")
    prompts, stats, rejects = run(cfg)
    assert [p.id for p in prompts] == ["T-a", "T-b"]
    assert prompts[0].messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
                                   {"role": "user", "content": "more"})
    assert prompts[1].messages[0] == {"role": "system", "content": "be brief"}
    assert [(r.source_index, r.reason) for r in rejects] == [
        (2, "bad_type"), (3, "roles_not_alternating"), (4, "empty_content"), (5, "bad_type"),
        (6, "missing_field"), (7, "duplicate"), (8, "unknown_role"), (9, "missing_field")]
    assert rejects[-1].detail == "'conversations' is missing in this row"
    assert all(isinstance(r, Reject) and r.dataset == "T" for r in rejects)
    assert stats.rows == 10 and stats.prompts == 2 and sum(stats.rejects.values()) == 8


def test_messages_parquet_with_content_hash_ids(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "a"}]}
            for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    cfg = cfg_for(tmp_path / "m.parquet", schema="messages", field="messages")
    first, _, _ = run(cfg)
    again, _, _ = run(cfg)
    assert len(first) == 5
    assert [p.id for p in first] == [p.id for p in again]  # stable across runs
    assert len({p.id for p in first}) == 5 and all(p.id.startswith("T-") for p in first)


def test_prompt_column_json_skips_done_ids_and_adds_system_prompt(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(orjson.dumps([{"problem": f"solve {i}", "id": i} for i in range(6)]))
    cfg = cfg_for(path, schema="prompt", field="problem", id_field="id", system_prompt="think")
    prompts, stats, _ = run(cfg, skip={"T-0", "T-3"})
    assert [p.id for p in prompts] == ["T-1", "T-2", "T-4", "T-5"]
    assert prompts[0].messages == ({"role": "system", "content": "think"}, {"role": "user", "content": "solve 1"})
    assert stats.skipped_done == 2


def test_shuffle_is_deterministic(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"q": f"item {i}"} for i in range(50)])
    cfg = cfg_for(path, schema="prompt", field="q", shuffle_seed=3)
    a, b = run(cfg)[0], run(cfg)[0]
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.messages[0]["content"] for p in a] != [f"item {i}" for i in range(50)]


@pytest.mark.parametrize(("row", "reason", "detail"), [
    ({"q": "x" * 10_000_001}, "prompt_too_long", "10000001 characters > source.max_prompt_chars = 400000"),
    ({"text": "hello"}, "missing_field", "no column 'q' (columns: text)"),  # the file has no such column
])
def test_too_long_prompts_and_a_missing_column_are_counted_rejects(tmp_path: Path, row: dict, reason: str,
                                                                  detail: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [row, {"q": "short"}] if "q" in row else [row])
    prompts, _, rejects = run(cfg_for(path, schema="prompt", field="q"))
    assert [p.messages[0]["content"] for p in prompts] == (["short"] if "q" in row else [])
    assert [(r.reason, r.detail) for r in rejects] == [(reason, detail)]  # rejected before any request


@pytest.mark.parametrize(("text", "message"), [
    ("this is not json\n", "{path} has no line that is a JSON object: its one non-blank line is bad (line 1 is not "
                           "valid JSON (invalid literal, expected 'true', column 1)). A JSON Lines file holds one JSON "
                           "object per line; is it the right file?"),
    (None, "{path} not found."),
])
def test_a_file_that_is_not_json_or_missing_names_the_file(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "broken.jsonl"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as e:
        run(cfg_for(path, schema="prompt", field="q"))
    assert str(e.value) == "T: source.files: " + message.format(path=path)


def test_demo_dataset_loads() -> None:
    from gen_pipeline.config.dataset import find_dataset_config

    cfg = find_dataset_config("demo")
    prompts, stats, rejects = run(cfg)
    assert len(prompts) == 300 and len(rejects) == 6
    assert any(p.messages[0]["role"] == "system" for p in prompts)
    assert any(p.user_turns > 1 for p in prompts)
