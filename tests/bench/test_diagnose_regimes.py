"""`diagnose`'s calibration from simulated H200 runs: long outputs KV-bound at token_usage ~0.68, short ones
step-bound; tests/data/diagnose_rows.json.gz is what the bench computes (GEN_PIPELINE_WRITE_DATA=1 rewrites it)."""

from __future__ import annotations

import gzip
import json
import os
import statistics
from pathlib import Path

import pytest

from bench import sim_vs_real as svr
from bench import sim_vs_real_long as long_regime
from bench.engine_run import run_traced
from bench.gpu.traces import telemetry_rows
from bench.gpu.verdicts import TRACE_FILES, run_rows
from bench.gpu.verdicts import verdicts as real_verdicts
from bench.jobs import Job
from gen_pipeline.reports.diagnose import SLOT_RULES, THRESHOLDS, diagnose, format_diagnosis
from sglang_sim.profiles import get_profile

pytestmark = pytest.mark.bench  # make bench-test

DATA = Path(__file__).resolve().parents[1] / "data" / "diagnose_rows.json.gz"


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


def _short_rows() -> list[dict]:
    """The first 800 lengths of the committed H200 short run, replayed adaptively."""
    real = svr.load_real()
    job = Job(svr.job_of(real).profile, svr.job_of(real).lengths[:800])
    return _rows(job, svr.H200Server(real, get_profile("h200")), None)


def test_short_outputs_at_the_same_pool_are_step_bound() -> None:
    rows = _short_rows()
    verdicts = diagnose(rows)
    assert [v.rule for v in verdicts][:1] == ["step_bound"], format_diagnosis("short", rows, verdicts)
    assert "kv_bound" not in [v.rule for v in verdicts]


def test_the_real_h200_traces_name_long_outputs_kv_bound_and_short_ones_never() -> None:
    """The committed H200 traces (runs 2-5), all-at-once and adaptive runs: long outputs kv_bound, short ones
    step_bound or kv_or_step; fixed windows hold no queue at the server, so no slot verdict."""
    runs = real_verdicts()
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


def _compact(rows: list[dict]) -> list[dict]:
    return [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]


def diagnose_rows() -> dict:
    """The telemetry rows of the simulated regimes and of every run of the committed H200 traces."""
    long_job = long_regime.synthetic_job(300)
    out: dict = {"simulated": {
        "long adaptive": _compact(_rows(long_job, long_regime.LongServer(), None)),
        "long all at once": _compact(_rows(long_job, long_regime.LongServer(), 300)),
        "short adaptive": _compact(_short_rows())}, "h200": []}
    for path in TRACE_FILES:
        data = json.loads(path.read_text())
        for regime in ("short", "long"):
            for run in data.get(regime, {}).get("runs", []):
                out["h200"].append({"file": path.name, "regime": regime, "client": run["client"],
                                    "round": run["round"], "cli": run.get("diagnose") or [],
                                    "rows": _compact(run_rows(data[regime], run))})
    return out


def test_the_committed_rows_are_what_the_bench_computes() -> None:
    rows = json.loads(json.dumps(diagnose_rows()))
    if os.environ.get("GEN_PIPELINE_WRITE_DATA") == "1":
        DATA.write_bytes(gzip.compress(json.dumps(rows, separators=(",", ":")).encode(), mtime=0))
    assert json.loads(gzip.decompress(DATA.read_bytes())) == rows, (
        f"{DATA} is stale: GEN_PIPELINE_WRITE_DATA=1 make bench-test ARGS=tests/bench/test_diagnose_regimes.py")
