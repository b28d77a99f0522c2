"""What users read about SGLang's CUDA-graph ceiling (issue 34): diagnose names it with the fix, plan warns
before a launch, and the final progress line is the whole run's average."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gen_pipeline.records import RunSnapshot
from gen_pipeline.reports.diagnose import diagnose, format_diagnosis
from gen_pipeline.run.progress import Progress
from gen_pipeline.run.stats import RunStats
from gen_pipeline.server.plan import profile_cuda_graph_max_bs, sglang_cuda_graph_max_bs

REAL = Path(__file__).resolve().parents[1] / "data" / "h200_ceiling_telemetry.json"


def _rows(polls: list[tuple[int, float]], ceiling: int | None = 256) -> list[dict[str, Any]]:
    """Telemetry rows of one run: (running, gen tok/s) per poll, 50 queued, a window of 3,000."""
    return [{"t_run_s": float(i), "run": 1, "window": 3000, "in_flight": running + 50, "running": running,
             "queued": 50, "kv_usage": 0.9, "kv_capacity_tokens": 120_000, "max_running_requests": 4096,
             "cuda_graph_max_bs": ceiling, "gen_tok_s": rate, "tokens_per_request": 450.0, "done": 10 * i,
             "retractions": 0, "restarts": 0, "mode": "fixed"} for i, (running, rate) in enumerate(polls)]


# the warm-up (first 20 %), then SGLang's batch at 224-255 with graphs and 288-320 without (one H100, issue 34)
CROSSING = [(100, 5000.0)] * 5 + [(240, 15_400.0)] * 8 + [(300, 8_100.0)] * 12


def test_diagnose_names_the_ceiling_with_the_fix() -> None:
    rows = _rows(CROSSING)
    assert format_diagnosis("h200short", rows, diagnose(rows)).splitlines() == [
        "h200short: run 1 (25 polls over 1 run(s); mode fixed)",
        "graph_ceiling: running crossed SGLang's CUDA-graph ceiling (256) and the decode slowed past it",
        "  300 running (median) in 12 of 20 polls after the warm-up, above cuda_graph_max_bs 256: each decode step "
        "of more than 256 requests runs without a CUDA graph",
        "  decode rate per running request 64.2 tok/s at or below 256 running (8 polls), 27.0 above: 0.42x; "
        "generation 15,400 tok/s below against 8,100 above (medians)",
        "  → keep the batch at or below 256: --window 256 or fewer (the adaptive controller holds requests in "
        "flight at the ceiling when the server reports cuda_graph_max_bs in /server_info)",
        '  → or raise the ceiling in the server profile: extra_args = ["--cuda-graph-max-bs", "512"] (SGLang '
        "captures decode graphs up to that batch: more GPU memory for them, a longer start-up)",
    ]


@pytest.mark.parametrize("polls, ceiling", [
    ([(100, 5000.0)] * 5 + [(240, 15_400.0)] * 20, 256),  # below the ceiling throughout
    ([(100, 5000.0)] * 5 + [(240, 15_400.0)] * 8 + [(300, 19_000.0)] * 12, 256),  # crossed, the rate per request held
    (CROSSING, None),  # a falling decode rate alone is no ceiling: the real short-regime gauge swings with prefills
])
def test_no_ceiling_verdict_where_the_batch_did_not_slow(polls: list[tuple[int, float]], ceiling: int | None) -> None:
    assert "graph_ceiling" not in [v.rule for v in diagnose(_rows(polls, ceiling))]


def test_the_real_h200_runs_past_the_ceiling() -> None:
    """tests/data/h200_ceiling_telemetry.json: the CLI's telemetry of the H200 runs (120K fp8 KV, 3,000 short
    prompts, 4 rounds; SGLang 0.5.17 reported cuda_graph_max_bs 256). All at once sat at ~300 running."""
    runs = json.loads(REAL.read_text())
    rules = {name: [v.rule for v in diagnose(rows)] for name, rows in runs.items()}
    assert {name for name, r in rules.items() if "graph_ceiling" in r} == {f"short-all-{i}" for i in (1, 2, 3, 4)}
    text = format_diagnosis("h200short", runs["short-all-1"], diagnose(runs["short-all-1"])).splitlines()
    assert text[1] == ("graph_ceiling: running stayed above SGLang's CUDA-graph ceiling (256): its decode steps ran "
                       "without a graph")
    assert text[2].startswith("  302 running (median) in 38 of 40 polls after the warm-up, above cuda_graph_max_bs 256")


def test_plan_reads_the_ceiling_of_the_node_and_the_profile() -> None:
    assert [sglang_cuda_graph_max_bs(m, tp) for m, tp in ((95.6, 8), (140.4, 1), (80, 1), (40, 8))] == [
        512, 256, 256, 160]
    assert profile_cuda_graph_max_bs(("--chunked-prefill-size", "8192", "--cuda-graph-max-bs", "768")) == 768
    assert profile_cuda_graph_max_bs(("--cuda-graph-max-bs-decode=384",)) == 384
    assert profile_cuda_graph_max_bs(("--chunked-prefill-size", "8192")) is None


def test_final_progress_line_is_the_whole_runs_average() -> None:
    """A run of 100 s: 9,282 tok/s on average, the last 512 completions in its last 10 s (issue 34's run: the
    final line said 21,668)."""
    now = [0.0]
    stats = RunStats(clock=lambda: now[0])
    for i in range(1000):  # 488 completions over the first 90 s, then 512 in the last 10 s
        now[0] = 90.0 * (i + 1) / 488 if i < 488 else 90.0 + 10.0 * (i - 487) / 512
        stats.count_sample(928 if i < 999 else 1000)
    assert now[0] == 100.0
    assert stats.average() == (10.0, pytest.approx(9280.72))
    last_minute = stats.throughput()
    assert last_minute[1] > 40_000  # the last minute's rate: what the final line used to print
    # the run ends at its last sample; a launched server's stop then takes 13 s (an H100 run's final line read
    # 18,712 tok/s for ~50K, its telemetry an idle tail of 14 s): the figures stay the run's
    stats.end()
    now[0] = 113.0
    assert (stats.elapsed_s(), stats.average(), stats.throughput()) == (100.0, (10.0, pytest.approx(9280.72)),
                                                                       last_minute)
    out = io.StringIO()
    sps, tps = stats.average()
    Progress("h200short", stream=out).update(RunSnapshot(
        done=1000, target=1000, samples_per_s=sps, tokens_per_s=tps, in_flight=0, window=256, final=True,
        peak_running=256, peak_queued=3))
    assert out.getvalue() == "h200short 1,000/1,000 (100.0%) 10.00 samples/s, 9,281 tok/s, peak running 256 queued 3\n"
