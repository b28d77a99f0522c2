"""Hypothesis invariants of the scheduler model over random request mixes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import PROFILES

POOL = 1500

# Prompts are built from a few shared "system prompts" plus a unique tail, so the mix
# exercises cache hits, splits, eviction and (with hicache) host hits.
request = st.tuples(
    st.integers(0, 3),  # which shared prefix
    st.integers(0, 200),  # shared prefix length used
    st.integers(1, 150),  # unique prompt tail
    st.integers(1, 700),  # output tokens
    st.integers(0, 200),  # extra max_new_tokens headroom the scheduler must assume
    st.integers(0, 30),  # steps to run before adding the next request
)
scenario = st.fixed_dictionaries({
    "requests": st.lists(request, min_size=1, max_size=25),
    "k": st.integers(1, 4),
    "hicache": st.sampled_from([0, 400]),
    "chunk": st.sampled_from([64, 8192]),
    "ratio": st.sampled_from([0.01, 0.05, 0.7]),
    "aborts": st.sets(st.integers(0, 24), max_size=3),
})


def drive(s: dict) -> tuple[Engine, list, list[dict]]:
    cfg = EngineConfig(max_total_num_tokens=POOL, num_continuous_decode_steps=s["k"],
                       hicache_tokens=s["hicache"], chunked_prefill_size=s["chunk"],
                       init_new_token_ratio=s["ratio"], new_token_ratio_decay_steps=s.get("decay", 600))
    engine = Engine(cfg, PROFILES["fast"])
    expected, done, trace = {}, [], []
    pending = list(enumerate(s["requests"]))
    while pending or not engine.idle:
        if pending:
            i, (which, shared, tail, out, extra, wait) = pending.pop(0)
            unique_from = 10**6 + i * 1000
            prompt = list(range(which * 1000, which * 1000 + shared)) + list(range(unique_from, unique_from + tail))
            out = min(out, POOL - len(prompt))
            engine.add_request(f"r{i}", prompt, list(range(5 * 10**6 + i * 1000, 5 * 10**6 + i * 1000 + out)),
                               max_new_tokens=out + extra)
            expected[f"r{i}"] = out
            if i in s["aborts"]:
                done.extend(engine.step().finished)
                engine.abort(f"r{i}")
        for _ in range(wait if pending else 1):
            step = engine.step()
            done.extend(step.finished)
            check_pool(engine)
            trace.append({"dt": step.dt_s, "new": step.new_tokens, "ret": step.retracted, "run": engine.num_running})
        assert len(trace) < 50_000, "engine does not make progress"
    done.extend(engine.step().finished)
    return engine, done, trace, expected


def check_pool(engine: Engine) -> None:
    cache = engine.cache_tokens
    assert engine.used_tokens <= POOL
    assert 0 <= cache["evictable"] <= cache["device"] <= engine.used_tokens
    assert cache["host"] >= 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_pool_never_overflows_and_tokens_are_conserved(s: dict) -> None:
    engine, done, _, expected = drive(s)
    by_rid = {f.rid: f for f in done}
    assert sorted(by_rid) == sorted(expected)  # every request reported exactly once
    for rid, f in by_rid.items():
        if f.finish_reason != "abort":
            assert f.completion_tokens == expected[rid]
        assert f.queue_time_s >= 0 and f.e2e_latency_s >= f.queue_time_s
    c = engine.counters()
    # Retraction keeps generated tokens (SGLang re-prefills prompt + output), so no token
    # is generated twice: the generation counter is exactly the sum of completions.
    assert c["generation_tokens_total"] == sum(f.completion_tokens for f in done) == c["decode_tokens_total"]
    assert c["recomputed_prefill_tokens_total"] <= c["retracted_tokens_total"]
    # drained: only the (unpinned) prefix cache holds KV
    cache = engine.cache_tokens
    assert engine.used_tokens == cache["device"] == cache["evictable"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_same_inputs_give_same_results(s: dict) -> None:
    first, done1, trace1, _ = drive(s)
    second, done2, trace2, _ = drive(s)
    assert trace1 == trace2
    assert done1 == done2
    assert first.counters() == second.counters()
    assert first.now_s == second.now_s


def test_invariants_hold_through_a_retraction_storm() -> None:
    """A seeded mix that overcommits on purpose: many retractions, host hits, then a drain."""
    s = {
        "requests": [(i % 4, 100, 20 + (37 * i) % 60, 200 + (97 * i) % 200, 0, 1) for i in range(25)],
        "k": 2, "hicache": 400, "chunk": 256, "ratio": 0.01, "aborts": {5}, "decay": 50,
    }
    engine, done, trace, expected = drive(s)
    c = engine.counters()
    assert c["num_retracted_requests_total"] == 11
    assert c["recomputed_prefill_tokens_total"] == 1626
    assert c["host_hit_tokens_total"] == 100
    assert sum(1 for t in trace if t["ret"]) == 11
    assert {f.rid: f.completion_tokens for f in done if f.finish_reason != "abort"} == {
        rid: n for rid, n in expected.items() if rid != "r5"}
    assert c["generation_tokens_total"] == sum(f.completion_tokens for f in done)
