"""Smoke test of the controller benchmark harness, the production dispatcher driven in simulated time
(`--quick`: one small cell; not a timing assertion)."""

from __future__ import annotations

import pytest

from bench import controller_bench
from bench.engine_run import run
from bench.jobs import LENGTH_PROFILES, SERVER_CONFIGS, Job

pytestmark = pytest.mark.bench  # make bench-test


def test_quick_matrix_completes_every_sample_once_with_sane_figures() -> None:
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
