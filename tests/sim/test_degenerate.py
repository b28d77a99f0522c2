"""The simulator's degenerate outputs (loops, leaks, marker-only answers): seeded by the request, whole and
streamed alike; a loop runs to max_tokens unless the client goes; the loop detector catches each in 512 tokens."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from gen_pipeline.quality import LeakReason, RepetitionDetector, check_turn
from sglang_sim import degenerate
from sglang_sim.faults import FaultSettings, OutputFault, decide_output
from sglang_sim.lengths import request_seed
from sglang_sim.tokenizer import decode, encode, render_chat

SIM_SEED = 11
# Slow enough that a looping 8,192-token turn takes ~40 s of real time: "still running" when the
# client leaves is true by construction (fast profile, ~5 ms a decode step at time scale 1).
SIM_ARGS = ["--reasoning-parser", "kimi_k2", "--sim-seed", str(SIM_SEED), "--sim-output-mean", "300",
            "--sim-output-spread", "0.3"]
NO_FAULTS = FaultSettings().to_json() | {"seed": SIM_SEED}


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def seed_of(text: str, max_tokens: int, **sampling: object) -> int:
    """The request seed the sim derives (generation._plan): rendered prompt + sampling + max_new_tokens."""
    return request_seed(SIM_SEED, render_chat(messages(text)), {**sampling, "max_new_tokens": max_tokens})


@pytest.mark.parametrize("seed", range(40))
def test_loop_outputs_run_to_the_cap_and_retokenize_to_themselves(seed: int) -> None:
    plan = degenerate.loop_output(seed, natural_tokens=900, max_new_tokens=2048)
    assert len(plan.ids) == 2048 and 0 <= plan.loop_start < 0.8 * 900
    assert encode(decode(plan.ids)) == plan.ids


@pytest.mark.parametrize("seeds", [
    pytest.param(range(0, 100), id="seeds-0-99"),
    # the rest of the 400 seeds: ~7 CPU-s of detector feeding, in make chaos (the default suite's budget)
    pytest.param(range(100, 400), id="seeds-100-399", marks=pytest.mark.slow)])
def test_every_loop_kind_is_written_and_caught_within_512_tokens(seeds: range) -> None:
    """The simulator's own loops are caught within ~512 tokens of their start (the sim tokenizer's)."""
    kinds = {}
    for seed in seeds:
        plan = degenerate.loop_output(seed, natural_tokens=4000, max_new_tokens=8192)
        det, fired_at = RepetitionDetector(), None
        for k in range(0, len(plan.ids), 4):  # four tokens a delta, as a stream with stream_interval 4
            if det.feed(decode(plan.ids[k:k + 4])) is not None:
                fired_at = k + 4
                break
        assert fired_at is not None, (seed, plan.kind)
        assert plan.loop_start < fired_at <= plan.loop_start + 512, (seed, plan.kind, fired_at - plan.loop_start)
        kinds[plan.kind] = max(kinds.get(plan.kind, 0), fired_at - plan.loop_start)
    assert set(kinds) == set(degenerate.LOOP_KINDS)


def test_output_faults_are_seeded_by_the_request_keep_their_rates_and_are_checked() -> None:
    s = FaultSettings(loop_rate=0.2, leak_rate=0.1, marker_only_rate=0.05, seed=3)
    picks = [decide_output(s, seed) for seed in range(20_000)]
    assert picks == [decide_output(s, seed) for seed in range(20_000)]
    share = {f: picks.count(f) / len(picks) for f in OutputFault}
    assert abs(share[OutputFault.LOOP] - 0.2) < 0.015 and abs(share[OutputFault.LEAK] - 0.1) < 0.01
    assert abs(share[OutputFault.MARKER_ONLY] - 0.05) < 0.008
    with pytest.raises(ValueError) as e:
        FaultSettings(loop_rate=0.7, leak_rate=0.4)
    assert str(e.value) == "loop_rate + leak_rate + marker_only_rate = 1.100; keep the sum <= 1"
    with pytest.raises(ValueError) as e:
        FaultSettings(marker_only_rate=-0.1)
    assert str(e.value) == "fault marker_only_rate must be within [0, 1] (got -0.1)"


def text_of(chunks: list[dict], field: str) -> str:
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


def test_a_loop_is_the_same_whole_or_streamed_runs_to_the_cap_and_a_new_seed_draws_anew(
        client: httpx.Client, faults, sse) -> None:
    faults(loop_rate=1.0)
    body = {"messages": messages("loop, whole and streamed"), "max_tokens": 600}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 600
    chunks = sse(body | {"stream_options": {"include_usage": True}})
    message = whole["choices"][0]["message"]
    assert text_of(chunks, "reasoning_content") == (message["reasoning_content"] or "")
    assert text_of(chunks, "content") == message["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 600
    plan = degenerate.loop_output(seed_of("loop, whole and streamed", 600), 0, 600)  # kind and text, by seed
    looped = (message["reasoning_content"] or "") + message["content"]
    assert looped.endswith(degenerate.loop_text(plan)[-200:])
    again = client.post("/v1/chat/completions", json=body).json()
    assert again["choices"][0]["message"] == message  # seeded by the request: runs repeat
    faults(loop_rate=0.5)  # a new seed draws anew
    s = FaultSettings(loop_rate=0.5, seed=SIM_SEED)
    looping = next(k for k in range(100) if decide_output(s, seed_of("retry me", 300, seed=k)) is OutputFault.LOOP)
    clean = next(k for k in range(100) if decide_output(s, seed_of("retry me", 300, seed=k)) is OutputFault.NONE)
    reasons = [client.post("/v1/chat/completions", json={"messages": messages("retry me"), "max_tokens": 300,
                                                          "seed": k}).json()["choices"][0]["finish_reason"]
               for k in (looping, clean)]
    assert reasons[0] == "length"
    assert sum(v for k, v in client.get("/sim/stats").json()["output_faults"].items() if k.startswith("loop_")) >= 1


def test_a_closed_stream_frees_the_looping_turn_at_once(client: httpx.Client, faults) -> None:
    """SGLang aborts a request whose HTTP stream is closed; the sim must too, or a looping turn would
    hold its slot and KV to its 8,192-token cap (~40 s here)."""
    faults(loop_rate=1.0)
    before = client.get("/v1/loads").json()["loads"][0]
    decoded_before = client.get("/sim/stats").json()["counters"]["decode_tokens_total"]
    det = RepetitionDetector()
    body = {"messages": messages("a loop the client aborts"), "max_tokens": 8192,
            "stream_options": {"continuous_usage_stats": True}}
    tokens = 0
    with client.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as s:
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
            if det.feed((delta.get("reasoning_content") or "") + (delta.get("content") or "")) is not None:
                break  # leaving the with-block closes the connection
    assert det.verdict is not None and tokens < 8192
    running = client.get("/v1/loads").json()["loads"][0]
    stats = client.get("/sim/stats").json()
    deadline = time.monotonic() + 60  # the abort lands within a few engine steps; a bound, not a wait
    # both states: the engine frees the request first, its ticket (in_flight) goes at the loop's next dispatch
    while (running["num_running_reqs"] or stats["in_flight"]) and time.monotonic() < deadline:
        running = client.get("/v1/loads").json()["loads"][0]
        stats = client.get("/sim/stats").json()
    assert running["num_running_reqs"] == 0 and running["num_waiting_reqs"] == 0
    assert running["num_used_tokens"] <= before["num_used_tokens"] + tokens + 200  # only the cached prefix stays
    assert stats["in_flight"] == 0
    # the engine stopped decoding it: far fewer than the 8,192 tokens it would have run to
    assert stats["counters"]["decode_tokens_total"] - decoded_before < tokens + 400


def test_leaks_and_marker_only_answers(client: httpx.Client, faults, sse) -> None:
    faults(leak_rate=0.5, marker_only_rate=0.5)
    s = FaultSettings(leak_rate=0.5, marker_only_rate=0.5, seed=SIM_SEED)
    found: dict[str, dict] = {}
    for k in range(60):
        text = f"leak probe {k}"
        fault = decide_output(s, seed_of(text, 400))
        kind = degenerate.leak_kind(seed_of(text, 400)) if fault is OutputFault.LEAK else fault.value
        if kind in found:
            continue
        body = {"messages": messages(text), "max_tokens": 400}
        whole = client.post("/v1/chat/completions", json=body).json()
        chunks = sse(body)
        message = whole["choices"][0]["message"]
        assert text_of(chunks, "content") == message["content"]
        assert text_of(chunks, "reasoning_content") == (message["reasoning_content"] or "")
        found[kind] = whole
        if len(found) == 3:
            break
    assert set(found) == {"reasoning_in_content", "think_markers", "marker_only"}
    reasons = {}
    for kind, whole in found.items():
        m = whole["choices"][0]
        f = check_turn(m["message"]["content"], m["message"]["reasoning_content"], m["finish_reason"],
                       reasoning_expected=True)
        reasons[kind] = f.reason if f else None
    assert reasons == {"reasoning_in_content": LeakReason.REASONING_IN_CONTENT,
                       "think_markers": LeakReason.THINK_MARKER, "marker_only": LeakReason.MARKER_ONLY}
    cut = found["reasoning_in_content"]
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 400
    assert cut["choices"][0]["message"]["reasoning_content"] is None


def test_continuous_usage_counts_tokens_and_reasoning(sse) -> None:
    body = {"messages": messages("usage as it goes"), "max_tokens": 200,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = sse(body)
    running = [c["usage"] for c in chunks if c["choices"] and c.get("usage")]
    assert running and [u["completion_tokens"] for u in running] == sorted(u["completion_tokens"] for u in running)
    final = chunks[-1]["usage"]
    assert final["completion_tokens"] == running[-1]["completion_tokens"]
    reasoning_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")]
    assert final["reasoning_tokens"] == max(u["reasoning_tokens"] for u in running) > 0
    assert all(c["usage"]["reasoning_tokens"] == c["usage"]["completion_tokens"] for c in reasoning_chunks)
    assert "usage" not in chunks[0] and chunks[0]["choices"][0]["delta"] == {
        "role": "assistant", "content": "", "reasoning_content": None}
