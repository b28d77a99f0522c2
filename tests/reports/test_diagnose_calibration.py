"""`diagnose` calibrated on the two H200 regimes (rows in tests/data/diagnose_rows.json.gz, written by
tests/bench/test_diagnose_regimes.py): long outputs are KV-bound at token_usage ~0.68, short ones step-bound."""

from __future__ import annotations

import gzip
import json
import statistics
from functools import cache
from pathlib import Path

import pytest

from gen_pipeline.reports.diagnose import SLOT_RULES, THRESHOLDS, diagnose, elasticity, format_diagnosis, view

DATA = Path(__file__).resolve().parents[1] / "data" / "diagnose_rows.json.gz"
FIRST_TRACES = "h200_traces.json"  # run 4's file, the first of the committed traces


@cache
def _data() -> dict:
    return json.loads(gzip.decompress(DATA.read_bytes()))


@pytest.mark.parametrize("name", ["long adaptive", "long all at once"])
def test_long_outputs_are_kv_bound_at_moderate_token_usage(name: str) -> None:
    rows = _data()["simulated"][name]
    usage = statistics.median(r["kv_usage"] for r in rows)
    assert usage < 0.75  # what the old rule (median >= 0.75 and 90th percentile >= 0.90) missed
    verdicts = diagnose(rows)
    assert verdicts[0].rule == "kv_bound", format_diagnosis("long", rows, verdicts)
    assert "compute_bound" not in [v.rule for v in verdicts]
    assert "the rest held by SGLang's admission reservation" in verdicts[0].evidence[0]


def test_short_outputs_at_the_same_pool_are_step_bound() -> None:
    rows = _data()["simulated"]["short adaptive"]
    verdicts = diagnose(rows)
    assert [v.rule for v in verdicts][:1] == ["step_bound"], format_diagnosis("short", rows, verdicts)
    assert "kv_bound" not in [v.rule for v in verdicts]


# ---------------------------------------------------------------- the real H200 traces (issue 19)


def test_the_real_h200_traces_name_long_outputs_kv_bound_and_short_ones_never() -> None:
    """Every all-at-once and adaptive run of the four committed H200 trace files (runs 2-5): long
    outputs kv_bound (the lower bound of the elasticity clears elastic_min), short outputs step_bound or
    kv_or_step (running pinned at ~150: the gauge's noise decides the slope's sign). Fixed windows hold no
    queue at the server: no slot verdict at all."""
    runs = [{**r, "elasticity": elasticity(view(r["rows"]).after_warmup),
             "rules": [v.rule for v in diagnose(r["rows"])]} for r in _data()["h200"]]
    assert sorted({r["file"] for r in runs}) == ["h200_traces.json", "h200_traces_run2.json", "h200_traces_run3.json",
                                                 "h200_traces_run5.json"]
    flooded = [r for r in runs if r["client"] in ("all", "adaptive")]
    long, short = [r for r in flooded if r["regime"] == "long"], [r for r in flooded if r["regime"] == "short"]
    assert (len(long), len(short)) == (28, 21)
    for r in long:
        assert r["rules"][0] == "kv_bound" and r["elasticity"].low >= THRESHOLDS["elastic_min"], r
    for r in short:
        assert r["rules"][0] in ("step_bound", "kv_or_step") and "kv_bound" not in r["rules"], r
        assert r["elasticity"] is None or r["elasticity"].low < THRESHOLDS["elastic_min"], r
    fixed = [r for r in runs if r["client"].startswith("fixed")]
    assert len(fixed) == 21 and not [r for r in fixed if set(r["rules"]) & set(SLOT_RULES)]


def _run4_short(client: str, round_: int) -> tuple[dict, list[dict]]:
    run = next(r for r in _data()["h200"] if (r["file"], r["regime"], r["client"], r["round"])
               == (FIRST_TRACES, "short", client, round_))
    return {"diagnose": run["cli"]}, run["rows"]


HALF_WINDOW = ("  → run once with --window 75 (half the running): if tokens/s falls by 16% or more, KV bounds the run "
               "(fp8 KV, mem fraction: more slots pay); if by less, the step time does (more servers add throughput, "
               "more KV does not)")


def test_run_4s_short_all_at_once_round_4_is_no_longer_kv_bound_on_noise() -> None:
    """The CLI named it kv_bound on the GPU machine; its slope's bounds lie far on both sides of elastic_min."""
    run, rows = _run4_short("all", 4)
    assert run["diagnose"] == ["kv_bound"]
    assert diagnose(rows)[0].lines() == [
        "kv_or_step: KV holds the decode slots; whether more slots would pay cannot be read from this run",
        "  150 running ≈ 60,000 KV tokens / 438 tokens per request = 137 slots, 1,067 queued at the server (requests "
        "waiting in 100% of 28 steady polls); KV 90% in use (median; 90th percentile 91%), the rest held by SGLang's "
        "admission reservation (new_token_ratio × min(max_new_tokens, 4096) per running request)",
        "  the decode rate grows -1.35x as fast as running (one-sided 95% bounds -3.88 to 1.18 over 35 polls after the "
        "warm-up, running spanning 1.25x): running moved too little against the decode rate's noise to say whether it "
        "grows at least 0.25x as fast; generation 15,980 tok/s",
        HALF_WINDOW]


def test_a_full_pool_whose_running_never_moved_is_not_kv_bound() -> None:
    """Run 4's short all-at-once round 1: running 140-163 after the warm-up, the pool's 90th percentile 0.92 (at
    or above kv_full, the fallback that named an unread slope kv_bound before)."""
    _, rows = _run4_short("all", 1)
    verdict = diagnose(rows)[0]
    assert verdict.rule == "kv_or_step" and verdict.lines()[2:] == [
        "  running stayed within 140-163 (1.16x, under the 1.25x needed) over 31 polls after the warm-up: too little "
        "to read how the decode rate grows with it; generation 18,384 tok/s", HALF_WINDOW]


def test_a_slope_is_trusted_only_within_its_confidence_bounds() -> None:
    """The same mean slope (1.0) on polls whose rate follows running (kv_bound), and with the rate's noise
    ten times the swing of running (kv_or_step); a flat rate over a wide swing is step_bound."""
    def rows(rate) -> list[dict]:
        return [{"t_run_s": float(i), "run": 1, "running": (r := 100 + (i % 5) * 8), "queued": 50, "in_flight": r + 50,
                 "window": r + 50, "kv_usage": 0.7, "kv_capacity_tokens": 60_000, "tokens_per_request": 500.0,
                 "max_running_requests": 3750, "gen_tok_s": rate(i, r), "done": i} for i in range(40)]

    def rules(rate) -> list[str]:
        return [v.rule for v in diagnose(rows(rate))]

    assert rules(lambda i, r: 100.0 * r)[:1] == ["kv_bound"]
    assert rules(lambda i, r: 100.0 * r * (1.5 if i % 3 == 0 else 0.8))[:1] == ["kv_or_step"]
    assert rules(lambda i, r: 10_000.0)[:1] == ["step_bound"]
    e = elasticity(rows(lambda i, r: 100.0 * r * (1.5 if i % 3 == 0 else 0.8)))
    assert e is not None and e.low < THRESHOLDS["elastic_min"] <= e.high and e.polls == 40


@pytest.mark.parametrize("df, table", [(3, 2.353), (5, 2.015), (10, 1.812), (20, 1.725), (30, 1.697)])
def test_t_quantile_matches_the_tables(df: int, table: float) -> None:
    from gen_pipeline.reports.diagnose import t_quantile
    assert abs(t_quantile(0.95, df) - table) < 1e-3
