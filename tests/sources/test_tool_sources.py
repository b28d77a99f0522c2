"""Tool-use rows in the sources: the `tools` column, assistant `tool_calls` (OpenAI shape, or sharegpt's
function_call / observation turns) and `tool` results are kept in the order chat templates accept."""

from __future__ import annotations

import orjson
import pytest

from gen_pipeline.config.dataset import DatasetConfig, SourceConfig
from gen_pipeline.sources.loading import InvalidRow, content_id, to_prompt

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def cfg(schema: str = "messages", field: str = "messages") -> DatasetConfig:
    return DatasetConfig(name="T", target_samples=1,
                         source=SourceConfig(files=("x.jsonl",), schema=schema, field=field))


def test_messages_rows_keep_tools_calls_and_results() -> None:
    row = {"tools": orjson.dumps(TOOLS).decode(), "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'},
        {"role": "assistant", "content": "3 degrees."}]}
    prompt = to_prompt(row, 0, cfg())
    assert orjson.loads(prompt.tools) == TOOLS
    assert prompt.messages == (
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "get_weather",
                                                                                  "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "content": '{"temp": 3}', "tool_call_id": "c1"},
        {"role": "assistant", "content": "3 degrees."})
    # the tools as a list (what `datasets` gives for a JSON array column) is the same prompt
    assert to_prompt({**row, "tools": TOOLS}, 0, cfg()) == prompt


def test_sharegpt_function_call_and_observation_turns() -> None:
    row = {"tools": TOOLS, "conversations": [
        {"from": "human", "value": "weather?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": 3}'},
        {"from": "gpt", "value": "3 degrees."}]}
    prompt = to_prompt(row, 0, cfg("sharegpt", "conversations"))
    calls = prompt.messages[1]["tool_calls"]
    assert calls == [{"id": "call_1_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]
    assert prompt.messages[2] == {"role": "tool", "content": '{"temp": 3}', "tool_call_id": "call_1_0"}


@pytest.mark.parametrize(("messages", "reason", "detail"), [
    ([{"role": "user", "content": "q"}], "bad_tools", "column 'tools' is not JSON: '{not json'"),  # tools: below
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "user", "content": "q2"}], "roles_not_alternating", "turn 2 is 'user', expected 'tool'"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": "c1"}],
     "roles_not_alternating", "turn 1 is 'tool', expected 'assistant'"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
     "bad_tool_call", "turn 1: the arguments of tool call 0 (f) are not JSON: '{oops'"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], "empty_content",
     "turn 1 has empty content"),  # no calls: an empty answer is still no answer
])
def test_rows_out_of_order_and_a_bad_tools_column_are_rejects(messages: list[dict], reason: str, detail: str) -> None:
    with pytest.raises(InvalidRow) as e:
        to_prompt({"tools": "{not json" if reason == "bad_tools" else TOOLS, "messages": messages}, 0, cfg())
    assert (e.value.reason, e.value.detail) == (reason, detail)


def test_plain_ids_do_not_change() -> None:
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert content_id(plain) == content_id(plain, "")  # conversations without tools keep their ids
    assert to_prompt({"messages": plain}, 0, cfg()).tools == ""


def test_object_columns_read_by_datasets_lose_the_nulls_of_other_rows(tmp_path) -> None:
    from gen_pipeline.sources.loading import SourceStats, iter_prompts

    other = {"type": "function", "function": {"name": "convert", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number"}}}}}
    rows = [{"id": str(i), "tools": [TOOLS[0], other][i:i + 1], "messages": [
        {"role": "user", "content": f"q{i}"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": ["get_weather", "convert"][i], "arguments": [{"city": "Oslo"}, {"amount": 3}][i]}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"}, {"role": "assistant", "content": "a"}]}
        for i in range(2)]
    data = tmp_path / "t.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    c = DatasetConfig(name="T", target_samples=2, path=tmp_path / "T.toml",
                      source=SourceConfig(files=("t.jsonl",), schema="messages", field="messages", id_field="id"))
    prompts = list(iter_prompts(c, set(), SourceStats(), []))
    assert [orjson.loads(p.tools) for p in prompts] == [[TOOLS[0]], [other]]
    assert [p.messages[1]["tool_calls"][0]["function"]["arguments"] for p in prompts] == ['{"city":"Oslo"}',
                                                                                         '{"amount":3}']


def test_the_bundled_tool_set_is_what_make_tools_writes(tmp_path) -> None:
    import runpy
    import shutil
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "datasets_cfg" / "data"
    script = Path(shutil.copy(data / "make_tools.py", tmp_path))
    runpy.run_path(str(script), run_name="__main__")  # in-process: it writes beside itself
    assert (tmp_path / "tools.jsonl").read_bytes() == (data / "tools.jsonl").read_bytes()
