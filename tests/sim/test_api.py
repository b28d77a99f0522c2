"""The simulator's HTTP API over real TCP: SGLang's shapes and types for every field the pipeline reads."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sglang_sim.testing import SimProcess
from sglang_sim.tokenizer import encode, render_chat

CONTEXT = 4096
SIM_ARGS = ["--enable-metrics", "--reasoning-parser", "kimi_k2", "--sim-output-mean", "40",
            "--context-length", str(CONTEXT), "--enable-cache-report", "--time-scale", "4",
            "--served-model-name", "kimi-sim", "--kv-cache-dtype", "fp8_e4m3"]
USER = [{"role": "user", "content": "Explain the radix cache in two sentences."}]


def chat(client: httpx.Client, **body: object) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "kimi-sim", "messages": USER, **body})


def test_health_endpoints_the_sim_time_header_and_the_ready_line(client: httpx.Client, sim: SimProcess) -> None:
    for path in ("/health", "/health_generate"):
        r = client.get(path)
        assert r.status_code == 200 and float(r.headers["x-sim-time"]) >= 0.0
    t1 = float(client.get("/health").headers["x-sim-time"])
    chat(client)
    assert float(client.get("/health").headers["x-sim-time"]) > t1
    # the capacity line comes before the ready line in the log
    text = sim.log_text()
    assert ("max_total_num_tokens=24576, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=") in text
    assert text.index("max_total_num_tokens=") < text.index("The server is fired up and ready to roll!")


def test_server_info_model_info_and_models(client: httpx.Client) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        # max_running_requests: the CLI value, not the effective one; 24576: the "fast" profile's pool
        expected = {"model_path": "sim/Kimi-K2.5", "served_model_name": "kimi-sim", "tp_size": 1, "dp_size": 1,
                    "mem_fraction_static": 0.88, "kv_cache_dtype": "fp8_e4m3", "hicache_size": 0,
                    "num_continuous_decode_steps": 1, "max_running_requests": None, "chunked_prefill_size": 8192,
                    "context_length": CONTEXT, "max_total_num_tokens": 24576}
        assert {k: info[k] for k in expected} == expected and info["enable_hierarchical_cache"] is False
        assert isinstance(info["version"], str) and isinstance(info["sim_time_s"], float)
        [state] = info["internal_states"]
        effective = state["effective_max_running_requests_per_dp"]
        assert isinstance(effective, int) and effective > 0 and state["memory_usage"]["token_capacity"] == 24576
        assert isinstance(state["last_gen_throughput"], float)
    for path in ("/model_info", "/get_model_info"):
        info = client.get(path).json()
        assert info["model_path"] == "sim/Kimi-K2.5" and info["is_generation"] is True
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [("kimi-sim", "model", CONTEXT)]


def test_chat_completion_shape_with_reasoning_and_determinism(client: httpx.Client) -> None:
    r = chat(client, max_tokens=1000, temperature=0.7)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "kimi-sim"
    assert isinstance(body["id"], str) and isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    msg = choice["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str) and msg["content"]
    assert isinstance(msg["reasoning_content"], str) and msg["reasoning_content"] and "<think>" not in msg["content"]
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(encode(render_chat(USER)))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the stop token counts (SGLang 0.5.17 returns it in the output ids) and is not in the text
    assert len(encode(msg["reasoning_content"] + msg["content"])) + 1 == usage["completion_tokens"]
    details = usage["prompt_tokens_details"]  # SGLang 0.5.17: null when nothing was cached, else the count
    assert details is None or (details.keys() == {"cached_tokens"} and details["cached_tokens"] > 0)
    # the same request, the same output
    a, b = chat(client, temperature=0.6).json(), chat(client, temperature=0.6).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    c = chat(client, temperature=0.9).json()  # other sampling params, another draw
    assert c["choices"][0]["message"] != a["choices"][0]["message"]


def test_max_and_min_tokens_and_the_reasoning_switches(client: httpx.Client) -> None:
    """max_tokens caps with finish_reason length; thinking off gives no reasoning; without separation the think
    markers stay in the content."""
    for key in ("max_tokens", "max_completion_tokens"):
        body = chat(client, **{key: 3}).json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3
    for kwargs in ({"thinking": False}, {"enable_thinking": False}):
        msg = chat(client, chat_template_kwargs=kwargs).json()["choices"][0]["message"]
        assert msg["reasoning_content"] is None
        assert "<think>" not in msg["content"] and "</think>" not in msg["content"]
    msg = chat(client, separate_reasoning=False).json()["choices"][0]["message"]
    assert msg["reasoning_content"] is None
    assert msg["content"].startswith("<think>") and msg["content"].count("</think>") == 1
    # SGLang's min_tokens / min_new_tokens (native): the output is at least that long; a bad value is a 400
    plain = chat(client, max_tokens=1000, temperature=0.0).json()["usage"]["completion_tokens"]
    longer = chat(client, max_tokens=1000, temperature=0.0, min_tokens=300).json()
    assert plain < 300 <= longer["usage"]["completion_tokens"] <= 1000
    native = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 500,
                                                                              "min_new_tokens": 200}}).json()
    assert native["meta_info"]["completion_tokens"] >= 200
    bad = chat(client, max_tokens=10, min_tokens=-1)
    assert bad.status_code == 400 and "min_tokens must be a non-negative integer (got -1)" in bad.text


def test_second_turn_hits_the_prefix_cache(client: httpx.Client, sse) -> None:
    off = {"thinking": False}
    flushed = client.post("/flush_cache")  # when idle; nothing cached: turn one finds nothing
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    before = client.get("/sim/stats").json()["turns"]
    first = chat(client, chat_template_kwargs=off, messages=[{"role": "user", "content": "Turn one, unique 8812."}])
    one = first.json()
    assert one["usage"]["prompt_tokens_details"] is None  # SGLang 0.5.17: null, not {"cached_tokens": 0}
    after_one = client.get("/sim/stats").json()["last_completed_sim_s"]
    history = [{"role": "user", "content": "Turn one, unique 8812."},
               {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
               {"role": "user", "content": "And turn two?"}]
    two = chat(client, chat_template_kwargs=off, messages=history).json()
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    # all of turn one but its stop token, which the rendered history does not hold
    assert cached >= one["usage"]["prompt_tokens"] + one["usage"]["completion_tokens"] - 1
    assert two["usage"]["prompt_tokens"] == len(encode(render_chat(history)))
    stats = client.get("/sim/stats").json()
    assert after_one < stats["last_completed_sim_s"] <= stats["sim_time_s"]  # the simulated time of the last answer
    turns = stats["turns"]
    grew = {k: turns[k] - before.get(k, 0) for k in turns}
    assert grew == {"first_turns": 1, "first_prompt_tokens": one["usage"]["prompt_tokens"], "first_cached_tokens": 0,
                    "later_turns": 1, "later_prompt_tokens": two["usage"]["prompt_tokens"],
                    "later_cached_tokens": cached, "later_prefix_hits": 1}
    sse({"model": "kimi-sim", "messages": history, "chat_template_kwargs": off})  # streamed: counted too
    assert client.get("/sim/stats").json()["turns"]["later_prefix_hits"] == turns["later_prefix_hits"] + 1


def test_streaming_matches_the_whole_response(client: httpx.Client, sse) -> None:
    body = {"model": "kimi-sim", "messages": USER, "temperature": 0.3, "max_tokens": 500}
    whole = client.post("/v1/chat/completions", json=body).json()
    chunks = sse({**body, "stream_options": {"include_usage": True}})
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    # SGLang 0.5.17 (sse_utils.py): a role chunk with empty content first; every delta carries
    # reasoning_content (null or text); role and content only when set
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert all("reasoning_content" in d for d in deltas)
    reasoning = "".join(d["reasoning_content"] or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (whole["choices"][0]["message"]["reasoning_content"],
                                    whole["choices"][0]["message"]["content"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert chunks[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    chunks = sse({"messages": USER})  # without include_usage: no usage chunk
    assert all(c["choices"] and "usage" not in c for c in chunks)  # msgspec omit_defaults drops usage=None
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_bad_requests_get_sglangs_400s(client: httpx.Client) -> None:
    error = {"object": "error", "type": "BadRequestError", "param": None, "code": 400}
    messages = [{"role": "user", "content": "word " * CONTEXT}]
    n = len(encode(render_chat(messages)))
    r = client.post("/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400
    assert r.json() == error | {"message": f"The input ({n} tokens) is longer than the model's context length "
                                           f"({CONTEXT} tokens)."}
    n = len(encode(render_chat(USER)))
    r = chat(client, max_tokens=CONTEXT)
    assert r.status_code == 400
    assert r.json()["message"] == (
        f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. "
        f"You requested a total of {n + CONTEXT} tokens: {n} tokens from the input messages and {CONTEXT} "
        f"tokens for the completion. Please reduce the number of tokens in the input messages or the "
        f"completion to fit within the limit.")
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["message"].startswith("Request body is not valid JSON")
    r = client.post("/v1/chat/completions", json={"messages": []})
    assert r.json() == error | {"message": "messages must be a non-empty list of {role, content} objects."}


def test_generate_native_meta_info_and_cumulative_streamed_text(client: httpx.Client, sse) -> None:
    for prompt in ({"text": "The capital of France is"}, {"input_ids": [11, 12, 13]}):
        r = client.post("/generate", json={**prompt, "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
        body = r.json()
        meta = body["meta_info"]
        assert isinstance(body["text"], str) and len(body["output_ids"]) == meta["completion_tokens"]
        assert meta["finish_reason"] in ({"type": "length", "length": 5}, {"type": "stop", "matched": 163586})
        assert isinstance(meta["id"], str) and isinstance(meta["e2e_latency"], float)
        assert (meta["prompt_tokens"], meta["num_retractions"]) == (len(encode(prompt.get("text", ""))) or 3, 0)
        assert isinstance(meta["cached_tokens"], int)
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 30}}
    whole = client.post("/generate", json=body).json()
    last = sse(body, "/generate")[-1]
    assert last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]


def test_loads_shape_and_metrics_with_sglang_names(client: httpx.Client) -> None:
    body = client.get("/v1/loads").json()
    assert isinstance(body["timestamp"], str) and isinstance(body["version"], str)
    [load] = body["loads"]
    for key in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens"):
        assert isinstance(load[key], int), key
    assert isinstance(load["token_usage"], float) and isinstance(load["gen_throughput"], float)
    assert load["max_total_num_tokens"] == 24576
    assert set(load["queues"]) == {"waiting", "grammar", "paused", "retracted", "prealloc_ready"}
    assert client.get("/v1/loads", params={"dp_rank": 3}).status_code == 400
    [old] = client.get("/get_load").json()
    assert set(old) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    # /metrics parses, with SGLang's names
    chat(client)
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:num_used_tokens", "sglang:num_retracted_reqs", "sglang:kv_used_tokens",
                 "sglang:new_token_ratio", "sglang:num_paused_reqs", "sglang:utilization"):
        assert families[name].type == "gauge", name
    for name in ("sglang:prompt_tokens", "sglang:generation_tokens", "sglang:cached_tokens", "sglang:num_requests"):
        assert families[name].type == "counter", name
    # A labelled counter has no sample before its first increment (SGLang 0.5.17, prometheus_client).
    assert "sglang:num_retracted_requests" not in families
    assert [s.value for s in families["sglang:num_retracted_reqs"].samples] == [0.0]
    [sample] = families["sglang:num_running_reqs"].samples
    assert sample.labels == {"model_name": "kimi-sim", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                             "moe_ep_rank": "0"}
    counters = client.get("/sim/stats").json()["counters"]
    [gen_total] = families["sglang:generation_tokens"].samples
    assert gen_total.name == "sglang:generation_tokens_total"
    assert gen_total.value == counters["generation_tokens_total"] > 0
