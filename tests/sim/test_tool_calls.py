"""The simulator's tool calls (sglang_sim/tools.py) over real TCP, in SGLang 0.5.17's shapes, whole and
streamed (the first piece names the call, the next ones carry arguments), and plain text without tools."""

from __future__ import annotations

import json

import httpx

from sglang_sim.tools import DIRECTIVE, requested_calls

SIM_ARGS = ["--tool-call-parser", "qwen25", "--sim-output-mean", "40", "--time-scale", "4",
            "--served-model-name", "tool-sim"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
ASK = (f'Weather and time in Paris? {DIRECTIVE}get_weather {{"city": "Paris", "units": {{"t": "C"}}}}]] '
       f'{DIRECTIVE}get_time {{"tz": "CET"}}]]')
MESSAGES = [{"role": "user", "content": ASK}]


def test_whole_answer_carries_the_calls_and_streamed_pieces_rebuild_them(client: httpx.Client, sse) -> None:
    body = {"model": "tool-sim", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 200}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["matched_stop"] is None
    message = choice["message"]
    assert message["content"] == ""
    assert [(c["index"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]] == [(0, "function", "get_weather", {"city": "Paris", "units": {"t": "C"}}),
                                                (1, "function", "get_time", {"tz": "CET"})]
    assert all(c["id"].startswith("call_") and len(c["id"]) == 29 for c in message["tool_calls"])
    # streamed, the pieces rebuild the whole calls
    body = {"model": "tool-sim", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    whole = client.post("/v1/chat/completions", json=body).json()
    chunks = sse({**body, "stream_options": {"include_usage": True}})
    pieces = [p for c in chunks if c["choices"] for p in c["choices"][0]["delta"].get("tool_calls") or []]
    firsts = [p for p in pieces if p["id"] is not None]
    assert [(p["index"], p["function"]["name"], p["function"]["arguments"]) for p in firsts] == [
        (0, "get_weather", ""), (1, "get_time", "")]
    rest = [p for p in pieces if p["id"] is None]
    assert all(p["function"]["name"] is None for p in rest)
    assert len(rest) > 2  # the arguments come in pieces
    args = {k: "".join(p["function"]["arguments"] for p in rest if p["index"] == k) for k in (0, 1)}
    assert [json.loads(args[k]) for k in (0, 1)] == [
        json.loads(c["function"]["arguments"]) for c in whole["choices"][0]["message"]["tool_calls"]]
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_kimi_ids_count_the_history(client: httpx.Client) -> None:
    # the id form follows the parser (kimi_k2: functions.NAME:N); this server's is qwen25, so uuid-like
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": f"12:00 {DIRECTIVE}get_time {{}}]]"}]
    body = {"model": "tool-sim", "messages": history, "tools": TOOLS, "max_tokens": 200}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]
    # kimi_k2's ids: functions.NAME:N, N counting the history's calls
    body = {"tools": TOOLS, "messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "function": {"name": "get_time"}}]},
        {"role": "tool", "content": ASK}]}
    assert [c.id for c in requested_calls(body, "kimi_k2", "rid")] == ["functions.get_weather:1",
                                                                       "functions.get_time:2"]
    assert requested_calls(body, None, "rid") == ()


def test_without_tools_or_directive_the_answer_is_text(client: httpx.Client) -> None:
    for body in ({"messages": MESSAGES}, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"},
                 {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}):
        choice = client.post("/v1/chat/completions", json={"model": "tool-sim", "max_tokens": 50, **body}).json()
        choice = choice["choices"][0]
        assert choice["message"]["tool_calls"] is None and choice["message"]["content"]
        assert choice["finish_reason"] in ("stop", "length")
