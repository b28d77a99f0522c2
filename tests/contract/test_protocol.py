"""The simulator's /v1/chat/completions (whole and streamed, reasoning included) and /generate
answers validate against SGLang's own protocol models, and carry no field SGLang does not have."""

from __future__ import annotations

import ast
import json
from dataclasses import replace

import httpx
import pydantic
from sglang_contract import source

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 60,
        "separate_reasoning": True}


def only_known_fields(model: type[pydantic.BaseModel], data: object, where: str) -> None:
    """Every key of `data` is a field of `model` (recursively through nested models), so a field
    SGLang does not serve cannot hide behind a model that allows extras."""
    if not isinstance(data, dict):
        return
    extra = set(data) - set(model.model_fields)
    assert not extra, f"{where}: {sorted(extra)} not in SGLang's {model.__name__}"
    for name, value in data.items():
        for sub in _models(model.model_fields[name].annotation):
            for item in value if isinstance(value, list) else [value]:
                only_known_fields(sub, item, f"{where}.{name}")


def _models(annotation: object) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models(arg)]


def test_chat_completion_validates_with_reasoning(sim):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionResponse

    body = httpx.post(sim.url + "/v1/chat/completions", json=CHAT, timeout=60).json()
    parsed = ChatCompletionResponse.model_validate(body)
    message = parsed.choices[0].message
    assert message.role == "assistant" and message.content and message.reasoning_content
    assert parsed.usage.completion_tokens > 0
    only_known_fields(ChatCompletionResponse, body, "chat.completion")
    # streamed
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionStreamResponse

    chunks = _stream(sim.url, CHAT | {"stream_options": {"include_usage": True}})  # ends with [DONE]
    parsed = [ChatCompletionStreamResponse.model_validate(c) for c in chunks]
    for c in chunks:
        only_known_fields(ChatCompletionStreamResponse, c, "chat.completion.chunk")
    deltas = [ch.delta for p in parsed for ch in p.choices]
    assert any(d.reasoning_content for d in deltas) and any(d.content for d in deltas)
    assert parsed[-1].usage is not None and parsed[-1].usage.completion_tokens > 0


_META_NAMES = {"meta_info", "meta_data"}
_META_SOURCES = ("srt/managers/tokenizer_manager.py", "srt/observability/req_time_stats.py")


def _meta_info_keys() -> set[str]:
    """Keys SGLang puts in meta_info (its tokenizer manager, plus the time stats it merges in):
    dict literals assigned to or `.update()`d into `meta_info`, and every `meta_info[...] = `."""
    keys: set[str] = set()
    for module in _META_SOURCES:
        for node in ast.walk(ast.parse(source(module))):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in _META_NAMES:
                        keys |= _literal_keys(node.value)
                    elif isinstance(target, ast.Subscript) and _is_meta_info(target.value):
                        keys |= _literal_keys(ast.Dict(keys=[target.slice], values=[target.slice]))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                  and _is_meta_info(node.func.value) and node.args):
                keys |= _literal_keys(node.args[0])
    return keys


def _literal_keys(node: ast.expr) -> set[str]:
    if not isinstance(node, ast.Dict):
        return set()
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _is_meta_info(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _META_NAMES
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "meta_info"


def test_generate_meta_info_keys_are_sglangs(sim):
    body = httpx.post(sim.url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 20}},
                      timeout=60).json()
    known = _meta_info_keys()
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "num_retractions",
            "e2e_latency", "queue_time"} <= known
    assert sorted(set(body["meta_info"]) - known) == []
    assert set(body) <= {"text", "output_ids", "meta_info"}
    assert body["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def _stream(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body | {"stream": True}, timeout=60) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _as_sglang_writes_it(chunk: dict) -> dict:
    """The same chunk rebuilt by SGLang 0.5.17's own stream writer (entrypoints/openai/sse_utils.py)."""
    from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

    choice = chunk["choices"][0]
    delta = choice["delta"]
    line = build_sse_content(chunk_id=chunk["id"], created=chunk["created"], model=chunk["model"], index=0,
                             role=delta.get("role"), content=delta.get("content"),
                             reasoning_content=delta.get("reasoning_content"),
                             finish_reason=choice["finish_reason"], logprobs=choice["logprobs"],
                             matched_stop=choice["matched_stop"], usage=chunk.get("usage"))
    return json.loads(line.removeprefix("data: "))


def test_degenerate_streams_are_sglangs_bytes(sim):
    """The sim's loops, leaks and marker-only answers streamed with continuous_usage_stats: every chunk is what
    SGLang's own writer makes of the same fields, every usage its UsageInfo, the stream ends as SGLang's."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionStreamResponse, UsageInfo

    seen: set[str] = set()
    try:
        off = {"loop_rate": 0, "leak_rate": 0, "marker_only_rate": 0}
        for faults in ({"loop_rate": 1.0}, {"leak_rate": 1.0}, {"marker_only_rate": 1.0}):
            httpx.post(sim.url + "/sim/faults", json=off | faults, timeout=10).raise_for_status()
            for k in range(6):
                body = CHAT | {"max_tokens": 300, "messages": [{"role": "user", "content": f"{faults} {k}"}],
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
                chunks = _stream(sim.url, body)
                for c in chunks:
                    ChatCompletionStreamResponse.model_validate(c)
                    only_known_fields(ChatCompletionStreamResponse, c, "chat.completion.chunk")
                    if c.get("usage") is not None:
                        assert c["usage"] == UsageInfo.model_validate(c["usage"]).model_dump()
                    if c["choices"]:
                        assert c == _as_sglang_writes_it(c)
                assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant",
                                                            "content": ""}
                finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
                assert len(finish) == 1 and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"]
        seen = set(httpx.get(sim.url + "/sim/stats", timeout=10).json()["output_faults"])
    finally:
        httpx.post(sim.url + "/sim/faults", json={"loop_rate": 0, "leak_rate": 0, "marker_only_rate": 0}, timeout=10)
    assert {"marker_only"} <= seen and any(s.startswith("loop_") for s in seen)
    assert any(s.startswith("leak_") for s in seen)


def test_token_ids_of_a_chat_completion_are_where_the_tokens_export_expects_them(sim):
    """export/tokens.py: return_(prompt_)token_ids on the request, choices[i].token_ids (raw output ids, stop
    token included) and .prompt_token_ids on the answer, refused with stream=true; the sim's answer is SGLang's."""
    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
    )

    request = ChatCompletionRequest.model_validate(CHAT | {"return_token_ids": True, "return_prompt_token_ids": True})
    assert request.return_token_ids and request.return_prompt_token_ids
    choice = ChatCompletionResponseChoice.model_validate(
        {"index": 0, "message": {"role": "assistant", "content": "x"}, "prompt_token_ids": [1, 2], "token_ids": [3]})
    assert (choice.model_dump()["prompt_token_ids"], choice.model_dump()["token_ids"]) == ([1, 2], [3])
    serving = source("srt/entrypoints/openai/serving_chat.py")
    assert 'ret_item["output_ids"] if request.return_token_ids else None' in serving
    assert "return_token_ids is not supported with streaming" in serving
    body = httpx.post(sim.url + "/v1/chat/completions", json=CHAT | {"return_token_ids": True}, timeout=60).json()
    parsed = ChatCompletionResponse.model_validate(body)
    choice = parsed.choices[0]
    assert choice.prompt_token_ids and len(choice.token_ids or []) == parsed.usage.completion_tokens
    only_known_fields(ChatCompletionResponse, body, "chat.completion")
    refused = httpx.post(sim.url + "/v1/chat/completions", json=CHAT | {"return_token_ids": True, "stream": True},
                         timeout=60)
    assert refused.status_code == 400


def test_the_clients_requests_are_sglangs():
    """Every turn streamed with the usage on each chunk (continuous_usage_stats); with [output] token_ids
    sent whole with both token-id flags (refused on a stream)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
    from gen_pipeline.run.wire import ClientSettings, build_request

    settings = ClientSettings(model="sim", backend="sglang", sampling=SamplingConfig(max_new_tokens=60),
                              generation=GenerationConfig(reasoning="keep"))
    streamed = ChatCompletionRequest.model_validate(build_request(CHAT["messages"], settings))
    assert streamed.stream and streamed.stream_options is not None
    assert streamed.stream_options.include_usage and streamed.stream_options.continuous_usage_stats
    whole = ChatCompletionRequest.model_validate(build_request(CHAT["messages"], replace(settings, token_ids=True)))
    assert not whole.stream and whole.return_token_ids and whole.return_prompt_token_ids


def test_draft_acceptance_is_where_the_client_reads_it():
    """run/wire.py: return_meta_info on a whole request (refused on a stream), choices[i].meta_info on the
    answer with tokenizer_manager's spec_* keys; the sim's draft answer validates and has only SGLang's keys."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse

    from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
    from gen_pipeline.run.wire import ClientSettings, build_request
    from sglang_sim.testing import start_sim

    settings = ClientSettings(model="sim", backend="sglang", sampling=SamplingConfig(max_new_tokens=60),
                              generation=GenerationConfig(on_loop="off"), speculative=True)
    request = build_request(CHAT["messages"], settings)
    assert ChatCompletionRequest.model_validate(request).return_meta_info
    assert ChatCompletionRequest.model_fields["return_meta_info"].default is False
    assert {"spec_accept_length", "spec_verify_ct", "spec_accept_rate", "spec_num_correct_drafts",
            "spec_num_proposed_drafts"} <= _meta_info_keys()
    serving = source("srt/entrypoints/openai/serving_chat.py")
    assert ('"return_meta_info is not supported with streaming. "\n                    "Please set stream=false when '
            'using return_meta_info=true."') in serving
    assert 'ret_item["meta_info"] if request.return_meta_info else None' in serving
    with start_sim(["--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4", "--log-level",
                    "warning"], ready_timeout_s=30) as sim:
        body = httpx.post(sim.url + "/v1/chat/completions", json=request, timeout=60).json()
    ChatCompletionResponse.model_validate(body)
    only_known_fields(ChatCompletionResponse, body, "chat.completion")
    meta = body["choices"][0]["meta_info"]
    assert sorted(set(meta) - _meta_info_keys()) == [] and meta["spec_verify_ct"] > 0
