"""bench/job_bench.py at a small scale (moved from tests/run/test_job.py: the default tests import no bench/)."""

from __future__ import annotations

import pytest

from bench.job_bench import run_bench

pytestmark = pytest.mark.bench  # make bench-test


def test_job_bench_quick_runs_exact_and_the_job_beats_sequential_runs() -> None:
    """bench/job_bench.py at a small scale: every dataset exact (asserted inside), one start beats four."""
    r = run_bench(scale=200, startup_s=600.0)
    a, b = r["a_sequential_runs"], r["b_job"]
    assert r["counts"] == {"B1": 150, "B2": 90, "B6": 100, "B7": 100}
    assert b["tokens"] == a["tokens"]  # the same samples, the same completions
    assert b["makespan_s"] < a["makespan_s"] - 3 * 600.0 + 1e-6  # three starts saved, drains not added
    assert 0 < b["idle_share"] < a["idle_share"] < 1
