"""Unit tests of the simulator's scheduler model (sglang_sim/engine.py)."""

from __future__ import annotations

import pytest

from sglang_sim.engine import Engine, EngineConfig, FinishedRequest, derive_max_running_requests
from sglang_sim.engine_request import SchedReq, admitted_reserve, clipped_reserve
from sglang_sim.profiles import PROFILES

FAST = PROFILES["fast"]


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run_until_idle(engine: Engine, max_steps: int = 100_000) -> list[FinishedRequest]:
    done: list[FinishedRequest] = []
    for _ in range(max_steps):
        if engine.idle:
            done.extend(engine.step().finished)  # pending aborts
            return done
        done.extend(engine.step().finished)
    raise AssertionError("engine did not drain")


def tight_pair(pool: int) -> Engine:
    """A running (prompt 10) and B (prompt 20), 60 tokens each, admitted one step apart (a low init
        ratio lets B in although both cannot finish in the pool)."""
    engine = Engine(EngineConfig(max_total_num_tokens=pool, init_new_token_ratio=0.1), FAST)
    engine.add_request("A", toks(0, 10), toks(1000, 60))
    assert engine.step().prefill_tokens == 10
    engine.add_request("B", toks(100, 20), toks(2000, 60))
    assert engine.step().prefill_tokens == 20
    return engine


def test_requests_too_long_for_the_context_or_the_pool_are_refused() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=10_000, context_length=100), FAST)
    with pytest.raises(ValueError) as err:
        engine.add_request("r", toks(0, 90), toks(0, 5), max_new_tokens=20)
    assert str(err.value) == (
        "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a "
        "total of 110 tokens: 90 tokens from the input messages and 20 tokens for the completion. Please "
        "reduce the number of tokens in the input messages or the completion to fit within the limit."
    )
    with pytest.raises(ValueError) as err:
        engine.add_request("r", toks(0, 100), toks(0, 1))
    assert str(err.value) == "The input (100 tokens) is longer than the model's context length (100 tokens)."
    engine = Engine(EngineConfig(max_total_num_tokens=100), FAST)
    with pytest.raises(ValueError) as err:
        engine.add_request("r", toks(0, 60), toks(0, 41))
    assert str(err.value) == (
        "The request needs 101 KV tokens (60 prompt + 41 output) but the KV cache pool holds "
        "max_total_num_tokens=100."
    )
    engine.add_request("ok", toks(0, 60), toks(0, 40))
    with pytest.raises(ValueError, match="Duplicate request rid 'ok'"):
        engine.add_request("ok", toks(0, 1), toks(0, 1))


def test_every_request_gets_exactly_its_output_within_max_running_requests() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=5000, num_continuous_decode_steps=3), FAST)
    lengths = {f"r{i}": (20 + i, 1 + 7 * i) for i in range(12)}
    for rid, (p, o) in lengths.items():
        engine.add_request(rid, toks(10_000 * int(rid[1:]), p), toks(500_000 + 1000 * int(rid[1:]), o),
                           "length" if o > 40 else "stop", max_new_tokens=max(o, 41))
    streamed: dict[str, int] = {}
    done: list[FinishedRequest] = []
    while not engine.idle:
        step = engine.step()
        for rid, n in step.new_tokens.items():
            assert 1 <= n <= 3
            streamed[rid] = streamed.get(rid, 0) + n
        done.extend(step.finished)
    assert {f.rid: f.completion_tokens for f in done} == {rid: o for rid, (_, o) in lengths.items()}
    assert streamed == {rid: o for rid, (_, o) in lengths.items()}
    expected = {rid: "length" if o > 40 else "stop" for rid, (_, o) in lengths.items()}
    assert {f.rid: f.finish_reason for f in done} == expected
    c = engine.counters()
    assert c["generation_tokens_total"] == sum(o for _, o in lengths.values()) == c["decode_tokens_total"]
    assert c["prompt_tokens_total"] == sum(p for p, _ in lengths.values())
    assert c["num_requests_total"] == 12
    # max_running_requests is respected
    engine = Engine(EngineConfig(max_total_num_tokens=20_000, max_running_requests=3), FAST)
    assert engine.max_running_requests == 3
    for i in range(10):
        engine.add_request(f"r{i}", toks(100 * i, 10), toks(0, 5))
    peak = 0
    while not engine.idle:
        engine.step()
        assert engine.num_running <= 3
        peak = max(peak, engine.num_running)
    assert peak == 3


@pytest.mark.parametrize(
    ("pool", "context", "expected"),
    [(116_000, 131_072, 2048), (24_576, 131_072, 2048), (1_000_000, 131_072, 3906),
     (10_000_000, 131_072, 4096), (1000, 131_072, 500)],
)
def test_derived_max_running_requests(pool: int, context: int, expected: int) -> None:
    assert derive_max_running_requests(pool, context) == expected
    engine = Engine(EngineConfig(max_total_num_tokens=pool, context_length=context), FAST)
    assert engine.max_running_requests == expected


def test_admission_reserves_clipped_max_new_tokens_also_when_readmitted() -> None:
    # B's prompt (10) + min(max_new, 4096) = 4106 must be < free + evictable - A's reservation.
    engine = Engine(EngineConfig(max_total_num_tokens=6000), FAST)
    engine.add_request("A", toks(0, 10), toks(1000, 50), max_new_tokens=8000)
    engine.step()
    reservation_a = 4096 * engine.new_token_ratio  # 2867.2 at ratio 0.7
    engine.add_request("B", toks(100, 10), toks(2000, 50), max_new_tokens=8000)
    free = 6000 - engine.used_tokens
    assert free - reservation_a <= 10 + 4096  # does not fit: B waits
    step = engine.step()
    assert step.prefill_tokens == 0 and step.decode_batch == 1
    assert engine.waiting_rids == ["B"]
    # a readmitted request: add_one_req checks the remaining max_new but adds min(max_new, CLIP) to the round's
    # offset (schedule_policy.py:1077-1080 vs 1203-1212)
    req = SchedReq("x", tuple(range(500)), prompt_len=100, out_len=400, max_new=5000, reason="stop",
                   arrival_s=0.0, generated=3000)
    assert clipped_reserve(req, 4096) == 2000 and admitted_reserve(req, 4096) == 4096


@pytest.mark.parametrize("pool", [100, 101, 130])
def test_retraction_happens_exactly_when_next_decode_does_not_fit(pool: int) -> None:
    engine = tight_pair(pool)
    seen_retraction = False
    while not engine.idle:
        waiting = engine.num_waiting
        room = pool - engine.used_tokens + engine.cache_tokens["evictable"]
        need = engine.num_running if waiting == 0 else None  # k=1: one token each
        step = engine.step()
        if need is not None and step.prefill_tokens == 0:
            assert bool(step.retracted) == (need > room), (need, room)
            seen_retraction |= bool(step.retracted)
    # A and B together need 10 + 20 + 120 = 150 tokens; the pool of 130 still runs short.
    assert seen_retraction


def test_retraction_picks_fewest_generated_then_longest_prompt_requeues_at_end_and_is_published() -> None:
    """The gauge (SGLang 0.5.17's num_retracted_reqs): the latest retraction, from the next stats log (a prefill
    batch or the 40th decode) until the one after."""
    engine = tight_pair(100)
    engine.add_request("C", toks(300, 5), toks(3000, 60))  # waits: no room
    shown = []
    while not shown or not shown[-1][0]:
        step = engine.step()
        shown.append((bool(step.retracted), engine.loads()["queues"]["retracted"]))
        assert step.retracted or engine.num_waiting == 1
    assert step.retracted == ["B"]  # tie on generated tokens: the longer prompt goes
    assert engine.waiting_rids == ["C", "B"]  # SGLang appends retracted requests to the queue
    assert engine.counters()["num_retracted_requests_total"] == 1
    assert engine.counters()["retracted_tokens_total"] == 20 + 35
    while not engine.idle:
        step = engine.step()
        shown.append((bool(step.retracted), engine.loads()["queues"]["retracted"]))
    at = next(i for i, (retracted, _) in enumerate(shown) if retracted)
    assert shown[at][1] == 0  # not yet logged
    logged = next(i for i in range(at + 1, len(shown)) if shown[i][1])
    assert shown[logged][1] == 1 and logged - at <= 40
    assert any(value == 0 for _, value in shown[logged + 1:])  # reset by the next log


def test_retracted_request_is_recomputed_and_counted() -> None:
    engine = tight_pair(100)
    done = {f.rid: f for f in run_until_idle(engine)}
    assert done["B"].retractions == 1 and done["A"].retractions == 0
    assert done["B"].completion_tokens == 60
    c = engine.counters()
    # B had 20 prompt + 35 generated tokens. Its prompt stays in the cache (unpinned, and A
    # never needed that room); its 35 generated tokens are freed without insert and recomputed.
    # SGLang 0.5.17 reports the cache hit of the first admission only (0 here), not the 20 found after
    # the retraction (schedule_batch.py counts cached_tokens while `not req.retracted_stain`).
    assert done["B"].cached_tokens == 0 and c["cached_prefill_tokens_total"] == 20
    assert c["recomputed_prefill_tokens_total"] == 35
    assert c["computed_prefill_tokens_total"] == 10 + 20 + 35
    assert c["generation_tokens_total"] == 120


def test_new_token_ratio_decays_to_floor_then_jumps_after_retraction() -> None:
    cfg = EngineConfig(max_total_num_tokens=100, init_new_token_ratio=0.5, new_token_ratio_decay_steps=10)
    engine = Engine(cfg, FAST)
    assert engine.new_token_ratio == 0.5
    engine.add_request("A", toks(0, 10), toks(1000, 30))
    engine.step()  # prefill: no decay
    assert engine.new_token_ratio == 0.5
    for i in range(1, 15):
        engine.step()
        assert engine.new_token_ratio == pytest.approx(max(0.5 - i * (0.5 - 0.07) / 10, 0.07))
    assert engine.new_token_ratio == pytest.approx(0.07)
    engine2 = tight_pair(100)
    while not engine2.step().retracted:
        pass
    # (generated by A + 20 * 1 running) / (max_new of A + 1)
    assert engine2.new_token_ratio == pytest.approx((35 + 20) / 61)
    engine = Engine(EngineConfig(max_total_num_tokens=100, schedule_conservativeness=2.0), FAST)
    assert engine.new_token_ratio == 1.0  # min(0.7 * 2, 1)


def test_prefix_cache_second_turn_shared_system_prompt_and_lru_eviction() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=20_000), FAST)
    prompt, output = toks(0, 300), toks(5000, 200)
    engine.add_request("t1", prompt, output)
    (t1,) = run_until_idle(engine)
    assert t1.cached_tokens == 0
    engine.add_request("t2", prompt + output + toks(9000, 50), toks(7000, 10))
    (t2,) = run_until_idle(engine)
    assert t2.cached_tokens == 500
    assert engine.counters()["cached_tokens_total"] == 500
    assert engine.loads()["cache_hit_rate"] == round(500 / (300 + 550), 4)
    # a shared system prompt is computed once
    engine = Engine(EngineConfig(max_total_num_tokens=20_000), FAST)
    system = toks(0, 400)
    engine.add_request("a", system + toks(1000, 20), toks(2000, 5))
    engine.step()  # a's prefill inserts the system prompt
    engine.add_request("b", system + toks(3000, 20), toks(4000, 5))
    assert engine.step().prefill_tokens == 20
    done = {f.rid: f.cached_tokens for f in run_until_idle(engine)}
    assert done == {"a": 0, "b": 400}
    # under pressure the cache is evicted LRU
    engine = Engine(EngineConfig(max_total_num_tokens=3000), FAST)
    for i in range(4):  # four finished 600-token sequences: 2400 cached tokens
        engine.add_request(f"old{i}", toks(10_000 * i, 500), toks(10_000 * i + 500, 100))
        run_until_idle(engine)
    assert engine.cache_tokens["device"] == 2400
    engine.add_request("big", toks(90_000, 1500), toks(95_000, 100))
    run_until_idle(engine)
    assert engine.used_tokens <= 3000
    # old0 and old1 (least recently used) were evicted; old3 is still cached
    engine.add_request("again0", toks(0, 500) + [1], toks(80_000, 1))
    engine.add_request("again3", toks(30_000, 500) + [1], toks(81_000, 1))
    done = {f.rid: f.cached_tokens for f in run_until_idle(engine)}
    assert done == {"again0": 0, "again3": 500}


def _evict_then_ask_again(hicache_tokens: int) -> tuple[Engine, FinishedRequest]:
    engine = Engine(EngineConfig(max_total_num_tokens=3000, hicache_tokens=hicache_tokens), FAST)
    engine.add_request("turn1", toks(0, 800), toks(5000, 200))
    run_until_idle(engine)
    engine.add_request("filler", toks(20_000, 2500), toks(30_000, 400))
    run_until_idle(engine)  # turn1's 1000 tokens are pushed out of the GPU pool
    engine.add_request("turn2", toks(0, 800) + toks(5000, 200) + toks(9000, 10), toks(40_000, 5))
    (turn2,) = run_until_idle(engine)
    return engine, turn2


def test_hicache_turns_recompute_into_host_hits_and_adds_no_decode_slots() -> None:
    plain, turn2_plain = _evict_then_ask_again(0)
    tiered, turn2_tiered = _evict_then_ask_again(10_000)
    assert turn2_plain.cached_tokens == 0
    assert turn2_tiered.cached_tokens == 1000
    assert tiered.counters()["host_hit_tokens_total"] == 1000
    computed = "computed_prefill_tokens_total"
    assert plain.counters()[computed] - tiered.counters()[computed] == 1000

    def peak_running(hicache_tokens: int) -> tuple[int, dict]:
        engine = Engine(EngineConfig(max_total_num_tokens=4000, hicache_tokens=hicache_tokens), FAST)
        for i in range(40):
            engine.add_request(f"r{i}", toks(1000 * i, 50 + i), toks(100_000 + 1000 * i, 100 + 3 * i))
        peak = 0
        while not engine.idle:
            engine.step()
            peak = max(peak, engine.num_running)
        return peak, engine.loads()

    (peak_off, loads_off), (peak_on, loads_on) = peak_running(0), peak_running(50_000)
    assert peak_off == peak_on
    assert loads_off["max_total_num_tokens"] == loads_on["max_total_num_tokens"] == 4000


def test_long_prompt_is_prefilled_in_chunks_while_decode_waits() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=24_576, chunked_prefill_size=8192), FAST)
    engine.add_request("short", toks(0, 10), toks(100, 50))
    engine.step()
    engine.add_request("long", toks(1000, 20_000), toks(50_000, 5))
    chunks = [engine.step() for _ in range(3)]
    assert [s.prefill_tokens for s in chunks] == [8192, 8192, 3616]
    assert all(s.new_tokens == {} for s in chunks)  # prefill iterations stall decode
    assert engine.step().new_tokens == {"short": 1, "long": 1}


def test_abort_frees_kv_and_reports_abort() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=5000, max_running_requests=1), FAST)
    engine.add_request("a", toks(0, 100), toks(1000, 50))
    engine.add_request("w", toks(2000, 100), toks(3000, 50))  # waits for the one slot
    engine.step()
    engine.step()
    assert engine.abort("a") is True and engine.abort("w") is True
    assert engine.abort("a") is False and engine.abort("nope") is False
    step = engine.step()
    assert [(f.rid, f.finish_reason, f.completion_tokens) for f in step.finished] == [
        ("a", "abort", 1), ("w", "abort", 0)]
    assert engine.idle and engine.used_tokens == engine.cache_tokens["device"]
    assert engine.cache_tokens["evictable"] == engine.cache_tokens["device"]


def test_clock_queue_time_latency_and_continuous_decode_steps() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=5000), FAST)
    engine.advance_idle(2.5)
    engine.add_request("r", toks(0, 100), toks(1000, 3))
    dts = []
    done: list[FinishedRequest] = []
    while not engine.idle:
        step = engine.step()
        dts.append(step.dt_s)
        done.extend(step.finished)
    # a decode pass attends over prompt + generated + the token being produced
    assert dts == [FAST.step_time_s(1, 0, 100), FAST.step_time_s(1, 101, 0),
                   FAST.step_time_s(1, 102, 0), FAST.step_time_s(1, 103, 0)]
    assert engine.now_s == pytest.approx(2.5 + sum(dts))
    assert done[0].queue_time_s == 0.0
    assert done[0].e2e_latency_s == pytest.approx(sum(dts))
    assert engine.step().dt_s == 0.0
    # continuous decode steps charge k passes
    engine = Engine(EngineConfig(max_total_num_tokens=5000, num_continuous_decode_steps=4), FAST)
    engine.add_request("r", toks(0, 100), toks(1000, 6))
    engine.step()
    first = engine.step()
    assert first.new_tokens == {"r": 4}
    assert first.dt_s == pytest.approx(sum(FAST.step_time_s(1, 100 + j + 1, 0) for j in range(4)))
    second = engine.step()
    assert second.new_tokens == {"r": 2}
    assert second.dt_s == pytest.approx(sum(FAST.step_time_s(1, 104 + j + 1, 0) for j in range(2)))


def test_loads_fields() -> None:
    engine = Engine(EngineConfig(max_total_num_tokens=1000, max_running_requests=1), FAST)
    engine.add_request("a", toks(0, 100), toks(1000, 50))
    engine.add_request("b", toks(2000, 30), toks(3000, 50))
    engine.step()
    loads = engine.loads()
    assert loads == {
        "dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 1, "num_waiting_uncached_tokens": 30,
        "num_used_tokens": 100, "num_total_tokens": 130, "num_active_tokens": 130, "max_total_num_tokens": 1000,
        "max_running_requests": 1, "token_usage": 0.1, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
        "utilization": 0.1, "total_prefill_uncached_tokens": 100,
        "total_prefill_busy_us": engine.counters()["prefill_busy_us_total"], "decode_moments": None,
        "queues": {"waiting": 1, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }
    for _ in range(40):
        engine.step()
    assert engine.loads()["gen_throughput"] > 0


# SGLang 0.5.17's admission rounds (schedule_policy.py PrefillAdder, scheduler.py)
def _long_regime(pool: int = 60_000, n: int = 40, out: int = 1200) -> Engine:
    """The issue-19 shape: prompts of 400, max_new_tokens 4096, everything queued at once."""
    engine = Engine(EngineConfig(max_total_num_tokens=pool, context_length=8192), PROFILES["h200"])
    for i in range(n):
        base = (i + 1) << 20
        engine.add_request(f"r{i}", toks(base, 400), toks(base + 400, out), max_new_tokens=4096)
    return engine


def test_first_round_reserves_whole_max_new_then_a_second_round_follows_at_once() -> None:
    """Round 1: 60,000 // (400 + 4096 + 1) = 13 go in, batch_is_full stays False (scheduler.py:2997-2999), so
    round 2 runs at once against a running reserve of 13 x 4096 x 0.7; then nothing until a request finishes."""
    engine = _long_regime()
    first = engine.step()
    assert (first.prefill_tokens, engine.num_running) == (13 * 400, 13)
    second = engine.step()
    room = 60_000 - 13 * 400 - 13 * 4096 * 0.7
    assert room // (400 + 4096 + 1) == 3
    assert (second.prefill_tokens, engine.num_running) == (3 * 400, 16)
    for _ in range(1199):  # 1,199 decodes: nobody has finished yet
        assert engine.step().decode_batch == 16
    assert engine.num_waiting == 24
    engine = Engine(EngineConfig(max_total_num_tokens=10_000), FAST)
    engine.add_request("a", toks(0, 100), toks(1000, 3), max_new_tokens=4096)
    engine.add_request("b", toks(2000, 100), toks(3000, 50), max_new_tokens=4096)
    engine.add_request("c", toks(4000, 100), toks(5000, 50), max_new_tokens=4096)
    engine.step()  # a, b in (2 x 4197 < 10,000); c does not fit: batch_is_full
    assert engine.waiting_rids == ["c"]
    kinds = []
    for _ in range(6):
        step = engine.step()
        kinds.append("prefill" if step.prefill_tokens else "decode" + ("+finish" if step.finished else ""))
    assert kinds == ["decode", "decode", "decode+finish", "decode", "prefill", "decode"]
    engine = _long_regime(n=20, out=1200)
    engine.step(), engine.step()
    for _ in range(700):
        engine.step()
    assert engine.new_token_ratio == pytest.approx(0.098)
    assert engine.reported_new_token_ratio == 0.7
    while not engine.step().prefill_tokens:
        pass
    assert engine.reported_new_token_ratio == pytest.approx(0.098)
