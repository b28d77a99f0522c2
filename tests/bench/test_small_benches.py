"""The small benchmarks at a tiny scale (`make bench-test`): the job, controller, affinity and client CPU
benches' figures and tables; not timing assertions."""

from __future__ import annotations

import pytest

from bench import controller_bench
from bench.affinity_bench import summarise as summarise_affinity
from bench.affinity_bench import verdicts
from bench.client_cpu import GOALS_MS, VARIANTS, measure, render, summarise
from bench.engine_run import run
from bench.job_bench import run_bench
from bench.jobs import LENGTH_PROFILES, SERVER_CONFIGS, Job

pytestmark = pytest.mark.bench  # make bench-test


def test_job_bench_quick_runs_exact_and_the_job_beats_sequential_runs() -> None:
    """bench/job_bench.py at a small scale: every dataset exact (asserted inside), one start beats four."""
    r = run_bench(scale=200, startup_s=600.0)
    a, b = r["a_sequential_runs"], r["b_job"]
    assert r["counts"] == {"B1": 150, "B2": 90, "B6": 100, "B7": 100}
    assert b["tokens"] == a["tokens"]  # the same samples, the same completions
    assert b["makespan_s"] < a["makespan_s"] - 3 * 600.0 + 1e-6  # three starts saved, drains not added
    assert 0 < b["idle_share"] < a["idle_share"] < 1


def test_quick_matrix_completes_every_sample_once_with_sane_figures() -> None:
    """The controller benchmark harness, the production dispatcher driven in simulated time (`--quick`)."""
    (cell,) = controller_bench.main(["--quick"])
    samples = controller_bench.QUICK["samples"]
    assert (cell["profile"], cell["server"], cell["samples"]) == ("B7", "116K", samples)
    assert set(cell["runs"]) == {"ours", "oracle", "fixed 32", "fixed 64", "fixed 150", "fixed 512", "all at once"}
    job = Job.sample(LENGTH_PROFILES["B7"], samples, controller_bench.SEED)
    job_tokens = sum(o for _, o, _ in job.lengths)
    for name, r in cell["runs"].items():
        assert (r["samples"], r["completed"], r["completion_tokens"]) == (samples, samples, job_tokens), name
        assert r["gen_tok_s"] * r["makespan_s"] == pytest.approx(job_tokens, rel=1e-3), name
        assert r["makespan_s"] > 0 and 0 <= r["recompute_share"] < 1, name
    runs = cell["runs"]
    assert runs["fixed 32"]["peak_running"] == 32 and runs["fixed 32"]["peak_queued"] == 0
    assert runs["all at once"]["peak_queued"] > 0
    # On a 116K pool with ~650-token requests, 32 in flight leaves KV idle: both adaptive clients do better.
    assert runs["ours"]["gen_tok_s"] > runs["fixed 32"]["gen_tok_s"]
    assert runs["oracle"]["gen_tok_s"] >= max(r["gen_tok_s"] for n, r in runs.items() if n != "ours")
    assert 0.5 < cell["ours_over_oracle"] <= 1.05


def test_a_fixed_client_never_exceeds_its_window_or_the_job() -> None:
    job = Job.sample(LENGTH_PROFILES["B1"], 50, seed=3)
    r, _ = run(job, SERVER_CONFIGS["116K"], fixed=8)
    assert (r.completed, r.peak_running, r.peak_queued) == (50, 8, 0)
    assert r.completion_tokens == sum(o for _, o, _ in job.lengths)


def test_affinity_ratios_are_taken_within_a_repetition_and_the_targets_judged_on_their_median() -> None:
    def row(rep: int, data: str, mode: str, rate: float, hit: float | None) -> dict:
        return {"rep": rep, "data": data, "mode": mode, "samples_per_sim_s": rate, "later_cached_share": 0.5,
                "later_prefix_hit_share": hit, "prefill_tokens_per_sample": 700.0, "retractions": 0,
                "requests_per_server": [10, 10, 10, 10]}

    rows = [row(0, "multi-turn", "affinity", 2.2, 0.95), row(0, "multi-turn", "free-kv", 2.0, 0.5),
            row(1, "multi-turn", "affinity", 3.3, 0.89), row(1, "multi-turn", "free-kv", 3.0, 0.4),  # a faster rep
            row(2, "multi-turn", "affinity", 2.04, 0.91), row(2, "multi-turn", "free-kv", 2.0, 0.45),
            row(0, "single-turn", "affinity", 9.6, None), row(0, "single-turn", "free-kv", 10.0, None)]
    table = summarise_affinity(rows)
    affinity = next(t for t in table if (t["data"], t["mode"]) == ("multi-turn", "affinity"))
    assert affinity["vs_free_kv_runs"] == [1.1, 1.1, 1.02] and affinity["vs_free_kv"] == 1.1
    assert affinity["later_prefix_hit_share"] == 0.91
    assert verdicts(table) == [
        "- later turns' prefix from cache under affinity ≥ 90 %: 91.0 %, met (free-kv: 45.0 %; 1/N = 25.0 %)",
        "- multi-turn throughput ≥ 1.05 × free-kv: 1.100 ×, met",
        "- single-turn throughput ≥ 0.97 × free-kv: 0.960 ×, MISSED"]


def test_a_tiny_client_cpu_run_gives_every_variant_its_medians_and_the_table_its_rows() -> None:
    r = measure(repeats=1, short=2, long=6)
    assert (r["requests_short"], r["requests_long"], r["repeats"]) == (2, 6, 1)
    for name, _, _, readers in VARIANTS:
        (run_,) = r[name]["runs"]
        assert run_["tokens_long"] > run_["tokens_short"] > 0  # completion tokens read from the samples written
        assert r[name]["median_tokens_long"] == run_["tokens_long"]
        assert r[name]["median_marginal_ms_per_1k_tokens"] == round(run_["marginal_ms_per_1k"], 2)
        assert ("pass" in r[name]) == (name in GOALS_MS)
        if readers:  # the main process's CPU is the run's less its readers' (run.log): less, never more
            assert 0 < run_["main_long_s"] < run_["cpu_long_s"], run_
        else:
            assert run_["main_long_s"] == run_["cpu_long_s"]
    lines = render(r).splitlines()
    assert lines[0] == "## Client CPU per 1K streamed tokens"
    header = next(line for line in lines if line.startswith("| figure"))
    assert header == ("| figure (median of 1) | streamed, interval 8 | streamed, interval 1 | "
                      "whole (on_loop = \"off\") | interval 8, 2 readers | interval 1, 2 readers |")
    rows = [line.split(" | ")[0] for line in lines if line.startswith("| ") and line is not header]
    assert rows == ["| marginal CPU per 1K completion tokens, main process (ms)",
                    "| marginal CPU per 1K completion tokens, main process + readers (ms)",
                    "| client CPU per 1K tokens, start-up included (ms)",
                    "| tokens the main process's core follows (marginal, tok/s)",
                    "| completion tokens of the 6-request run", "| goal (ms per 1K, main process)",
                    "| on the H200 (real SGLang, ms per 1K)",
                    "| on one H100, small model (real SGLang; main / all, ms per 1K)"]


def test_a_marginal_below_the_noise_gives_no_rate_one_core_follows() -> None:
    def cpu_run(marginal: float) -> dict:
        return {"marginal_ms_per_1k": marginal, "main_marginal_ms_per_1k": marginal, "total_ms_per_1k": 5.0,
                "tokens_long": 900, "wall_long_s": 1.0}
    assert summarise([cpu_run(-0.6), cpu_run(-0.2), cpu_run(3.0)])["median_tokens_per_cpu_s"] is None
    assert summarise([cpu_run(8.0), cpu_run(10.0), cpu_run(12.0)])["median_tokens_per_cpu_s"] == 100_000  # 1e6/10 ms
