"""The affinity benchmark's arithmetic (bench/affinity_bench.py): ratios within a repetition, medians
over them, the issue's targets judged from the medians (`make bench-test`)."""

from __future__ import annotations

import pytest

from bench.affinity_bench import summarise, verdicts

pytestmark = pytest.mark.bench


def row(rep: int, data: str, mode: str, rate: float, hit: float | None) -> dict:
    return {"rep": rep, "data": data, "mode": mode, "samples_per_sim_s": rate, "later_cached_share": 0.5,
            "later_prefix_hit_share": hit, "prefill_tokens_per_sample": 700.0, "retractions": 0,
            "requests_per_server": [10, 10, 10, 10]}


def test_ratios_are_taken_within_a_repetition_and_the_targets_judged_on_their_median():
    rows = [row(0, "multi-turn", "affinity", 2.2, 0.95), row(0, "multi-turn", "free-kv", 2.0, 0.5),
            row(1, "multi-turn", "affinity", 3.3, 0.89), row(1, "multi-turn", "free-kv", 3.0, 0.4),  # a faster rep
            row(2, "multi-turn", "affinity", 2.04, 0.91), row(2, "multi-turn", "free-kv", 2.0, 0.45),
            row(0, "single-turn", "affinity", 9.6, None), row(0, "single-turn", "free-kv", 10.0, None)]
    table = summarise(rows)
    affinity = next(t for t in table if (t["data"], t["mode"]) == ("multi-turn", "affinity"))
    assert affinity["vs_free_kv_runs"] == [1.1, 1.1, 1.02] and affinity["vs_free_kv"] == 1.1
    assert affinity["later_prefix_hit_share"] == 0.91
    assert verdicts(table) == [
        "- later turns' prefix from cache under affinity ≥ 90 %: 91.0 %, met (free-kv: 45.0 %; 1/N = 25.0 %)",
        "- multi-turn throughput ≥ 1.05 × free-kv: 1.100 ×, met",
        "- single-turn throughput ≥ 0.97 × free-kv: 0.960 ×, MISSED"]
