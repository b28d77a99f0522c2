"""The gate's counts over rows and failures (quality/accounting.py) and where they are shown
(status's note line, the report page), with the saved estimate's formula."""

from __future__ import annotations

import html

import pytest

from gen_pipeline.quality.accounting import add_failure, add_meta, format_gate, merged
from gen_pipeline.reports.page import render_html
from gen_pipeline.reports.status import DatasetStatus, StatusReport, format_status


def per_turn(**kw: object) -> dict:
    return {"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 100, "reasoning_tokens": 40,
            "attempts": 1, "loops": 0, "empty": 0, "leak": "", "tokens_not_decoded": 0, "discarded_tokens": 0} | kw


def test_counts_over_rows_and_failures() -> None:
    counts: dict[str, int] = {}
    add_meta(counts, {"per_turn": [per_turn(), per_turn(attempts=3, loops=1, empty=1, tokens_not_decoded=7800,
                                                            discarded_tokens=500)]})
    add_meta(counts, {"per_turn": [per_turn(finish_reason="loop", loops=1, tokens_not_decoded=7900)]})
    add_meta(counts, {"per_turn": [per_turn(leak="think_marker")]})
    add_meta(counts, {"finish_reason": "stop"})  # a row written before the gate: nothing
    add_failure(counts, {"id": "x", "reason": "loop", "loops": 2, "tokens_not_decoded": 15000,
                         "discarded_tokens": 700})
    assert counts == {"turns": 4, "retried_turns": 1, "loops": 4, "loops_kept": 1, "empty": 1, "leaks": 1,
                      "tokens_not_decoded": 30700, "discarded_tokens": 1200}
    assert merged([counts, {"loops": 1}])["loops"] == 5
    assert format_gate(counts, 5400.0) == (
        "quality gate: 4 loops caught (1 kept cut), 1 empty answer retried, 1 leak flagged; 30,700 tokens not "
        "decoded (~1.50 GPU-h saved), 1,200 decoded and discarded")
    assert format_gate({"turns": 9}) == ""


def test_status_and_the_report_show_the_gate_with_the_estimate() -> None:
    d = DatasetStatus("B2", 100, done=100, completion_tokens=390_000, state="finished",
                      gate={"turns": 100, "loops": 2, "tokens_not_decoded": 15_000, "discarded_tokens": 10_000},
                      run_wall_s=800.0)
    # tokens not decoded × the runs' server-seconds per decoded token (written + discarded)
    assert d.server_s_saved == pytest.approx(15_000 * 800.0 / 400_000)
    assert d.to_dict()["server_s_saved"] == 30.0
    report = StatusReport([d], 100, 100, ["B2"])
    line = ("quality gate: 2 loops caught, 0 empty answers retried, 0 leaks flagged; 15,000 tokens not decoded "
            "(~30.0 server-s saved), 10,000 decoded and discarded")
    assert f"B2: {line}" in format_status(report).splitlines()
    page = render_html("B2", [], report, "no diagnosis")
    assert html.escape(f"B2: {line} (saved: an estimate, tokens not decoded up to max_new_tokens × the runs' wall "
                       "time × GPUs ÷ every token they decoded)") in page
