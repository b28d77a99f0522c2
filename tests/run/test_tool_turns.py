"""Tool-use conversations through the client, with answers in SGLang 0.5.17's shapes (serving_chat.py):
the sample ends at the first regenerated call that differs from the source's (meta.tool_divergence)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.quality import RepetitionDetector
from gen_pipeline.records import Prompt, Sample
from gen_pipeline.run.chat import ChatClient, same_calls
from gen_pipeline.run.wire import ClientSettings, TurnStream, parse_response

from mock_http import mock_http

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def call(cid: str, args: str, name: str = "get_weather") -> dict:
    return {"id": cid, "index": 0, "type": "function", "function": {"name": name, "arguments": args}}


def whole(content: str = "", calls: list[dict] | None = None) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": None,
                                                  "tool_calls": calls},
                         "finish_reason": "tool_calls" if calls else "stop"}], "usage": USAGE}


def settings(on_loop: str = "off") -> ClientSettings:
    return ClientSettings(model="m", backend="sim", sampling=SamplingConfig(max_new_tokens=64, temperature=0.5),
                          generation=GenerationConfig(max_attempts=2, retry_initial_wait_s=0.001,
                                                      retry_max_wait_s=0.002, on_loop=on_loop))


SOURCE = Prompt("T-1", (
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [call("src_0", '{"city": "Paris"}')]},
    {"role": "tool", "content": '{"temp": 12}', "tool_call_id": "src_0"},
    {"role": "assistant", "content": "12 degrees."},
    {"role": "user", "content": "and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("src_1", '{"city": "Rome"}')]},
    {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "src_1"},
    {"role": "assistant", "content": "20 degrees."},
), tools=orjson.dumps(TOOLS).decode())


def test_a_whole_answer_of_tool_calls_is_read_with_its_finish_reason() -> None:
    turn = parse_response(whole(calls=[call("call_a", '{"city": "Paris"}')]))
    assert (turn.content, turn.finish_reason) == ("", "tool_calls")
    assert turn.tool_calls == [{"id": "call_a", "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    # SGLang may send arguments as an object (FunctionResponse.arguments: str | dict): kept as JSON text
    assert parse_response(whole(calls=[call("c", {"city": "Oslo"})])).tool_calls[0]["function"]["arguments"] == \
        '{"city":"Oslo"}'  # type: ignore[arg-type]


def test_streamed_tool_call_pieces_are_joined() -> None:
    stream = TurnStream(RepetitionDetector())
    base = {"id": "r", "model": "m", "object": "chat.completion.chunk"}
    pieces = [{"role": "assistant", "content": ""},
              {"tool_calls": [{"id": "functions.get_weather:0", "index": 0, "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]},
              {"tool_calls": [{"id": None, "index": 0, "type": "function", "function": {"name": None,
                                                                                       "arguments": '{"city": '}}]},
              {"tool_calls": [{"id": None, "index": 0, "type": "function", "function": {"name": None,
                                                                                       "arguments": '"Paris"}'}}]}]
    for delta in pieces:
        stream.feed({**base, "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta},
                                          "finish_reason": None}], "usage": USAGE})
    stream.feed({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    turn = stream.result()
    assert (turn.content, turn.finish_reason) == ("", "tool_calls")
    assert turn.tool_calls == [{"id": "functions.get_weather:0", "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]


def test_same_calls_compares_arguments_as_json() -> None:
    assert same_calls([call("a", '{"a": 1, "b": [2]}')], [call("b", '{"b": [2],  "a": 1}')])
    assert not same_calls([call("a", '{"a": 1}')], [call("b", '{"a": 2}')])
    assert not same_calls([call("a", "{}", name="x")], [call("a", "{}")])
    assert same_calls(None, None) and not same_calls(None, [call("a", "{}")])


async def _regenerate(answers: list[dict], prompt: Prompt = SOURCE) -> tuple[Sample, list[dict]]:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, json=answers[len(seen) - 1])

    async with mock_http(handler) as http:
        sample = await ChatClient(http, ["http://s"], settings()).regenerate(prompt, "T")
    assert isinstance(sample, Sample), sample
    return sample, seen


async def test_matching_calls_keep_the_sources_results_and_regenerate_every_turn() -> None:
    sample, seen = await _regenerate([whole(calls=[call("new_0", '{"city":"Paris"}')]), whole("It is 12."),
                                      whole(calls=[call("new_1", '{"city": "Rome"}')]), whole("It is 20.")])
    assert len(seen) == 4 and all(b["tools"] == TOOLS and b["tool_choice"] == "auto" for b in seen)
    # the history sent: the regenerated calls, the source's results answering them by the new ids
    assert seen[1]["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "new_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "content": '{"temp": 12}', "tool_call_id": "new_0"}]
    assert [m["role"] for m in sample.conversations] == ["user", "assistant", "tool", "assistant"] * 2
    assert [t["finish_reason"] for t in sample.meta["per_turn"]] == ["tool_calls", "stop", "tool_calls", "stop"]
    assert (sample.meta["tool_divergence"], sample.meta["tools"]) == (0, SOURCE.tools)
    assert sample.conversations[1]["content"] == "" and sample.meta["per_turn"][0]["empty"] == 0


@pytest.mark.parametrize(("answers", "turns"), [
    ([whole(calls=[call("n", '{"city": "Lyon"}')])], 1),  # other arguments
    ([whole("I cannot look that up.")], 1),  # text where the source called
    ([whole(calls=[call("n", '{"city": "Paris"}')]), whole(calls=[call("m", '{"city": "Paris"}')])], 2),  # a call
])
async def test_the_sample_ends_at_the_first_divergence(answers: list[dict], turns: int) -> None:
    sample, seen = await _regenerate(answers)
    assert len(seen) == turns and sample.meta["turns"] == turns
    assert sample.meta["tool_divergence"] == turns
    last, answer = sample.conversations[-1], answers[-1]["choices"][0]["message"]
    assert last["role"] == "assistant" and last["content"] == answer["content"]  # kept as the target produced it
    assert [c["function"] for c in last.get("tool_calls") or []] == [c["function"] for c in answer["tool_calls"] or []]


async def test_samples_without_tools_send_none() -> None:
    sample, seen = await _regenerate([whole("hi")], Prompt("T-2", ({"role": "user", "content": "q"},)))
    assert "tools" not in seen[0] and "tool_choice" not in seen[0]
    assert "tools" not in sample.meta and "tool_divergence" not in sample.meta


async def test_tool_turns_without_tools_diverge_where_the_target_answers_in_text() -> None:
    # a source with tool turns but no `tools` column: nothing to send, the target answers in text, and the
    # source's results (of calls the target did not make) are never sent after it
    sample, seen = await _regenerate([whole("It is probably mild.")] * 4, Prompt("T-3", SOURCE.messages))
    assert len(seen) == 1 and "tools" not in seen[0]
    assert (sample.meta["tool_divergence"], sample.meta["tools"], sample.meta["turns"]) == (1, "", 1)
