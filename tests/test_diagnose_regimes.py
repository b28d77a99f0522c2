"""`diagnose` on the two H200 regimes of issue 19, from simulated runs through the production dispatcher
(bench/engine_run.py, simulated time, hardware profile "h200"): long outputs are KV-bound although
token_usage reads ~0.68 (SGLang's admission reservation holds the rest); short outputs at the same pool
are bound by the step time (the best window on the H200 was 128, below what KV admits)."""

from __future__ import annotations

import statistics

import pytest

from bench import sim_vs_real as svr
from bench import sim_vs_real_long as long_regime
from bench.engine_run import run_traced
from bench.gpu.traces import telemetry_rows
from bench.jobs import Job
from gen_pipeline.reports.diagnose import diagnose, format_diagnosis
from sglang_sim.profiles import get_profile


def _rows(job: Job, server, window: int | None) -> list[dict]:
    engine = server.engine()
    result, trace = run_traced(job, server, window)
    assert result.completed == len(job.lengths)
    per_request = statistics.fmean(p + c for p, c, _ in job.lengths)
    return telemetry_rows(trace, kv_tokens=engine.config.max_total_num_tokens, max_running=engine.max_running_requests,
                          tokens_per_request=per_request)


@pytest.mark.parametrize("window", [None, 300], ids=["adaptive", "all at once"])
def test_long_outputs_are_kv_bound_at_moderate_token_usage(window: int | None) -> None:
    job = long_regime.synthetic_job(300)
    rows = _rows(job, long_regime.LongServer(), window)
    usage = statistics.median(r["kv_usage"] for r in rows)
    assert usage < 0.75  # what the old rule (median >= 0.75 and 90th percentile >= 0.90) missed
    verdicts = diagnose(rows)
    assert verdicts[0].rule == "kv_bound", format_diagnosis("long", rows, verdicts)
    assert "compute_bound" not in [v.rule for v in verdicts]
    assert "the rest held by SGLang's admission reservation" in verdicts[0].evidence[0]


def test_short_outputs_at_the_same_pool_are_step_bound() -> None:
    real = svr.load_real()
    job = Job(svr.job_of(real).profile, svr.job_of(real).lengths[:800])
    rows = _rows(job, svr.H200Server(real, get_profile("h200")), None)
    verdicts = diagnose(rows)
    assert [v.rule for v in verdicts][:1] == ["step_bound"], format_diagnosis("short", rows, verdicts)
    assert "kv_bound" not in [v.rule for v in verdicts]
