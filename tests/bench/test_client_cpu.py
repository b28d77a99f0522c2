"""The client CPU benchmark (bench/client_cpu.py) on a tiny run: its results' shape and its table
(`make bench-test`)."""

from __future__ import annotations

import pytest

from bench.client_cpu import GOALS_MS, VARIANTS, measure, render, summarise

pytestmark = pytest.mark.bench


def test_a_tiny_run_gives_every_variant_its_medians_and_the_table_its_rows() -> None:
    r = measure(repeats=1, short=2, long=6)
    assert (r["requests_short"], r["requests_long"], r["repeats"]) == (2, 6, 1)
    for name, _, _ in VARIANTS:
        (run,) = r[name]["runs"]
        assert run["tokens_long"] > run["tokens_short"] > 0  # completion tokens read from the samples written
        assert r[name]["median_tokens_long"] == run["tokens_long"]
        assert r[name]["median_marginal_ms_per_1k_tokens"] == round(run["marginal_ms_per_1k"], 2)
        assert ("pass" in r[name]) == (name in GOALS_MS)
    md = render(r)
    lines = md.splitlines()
    assert lines[0] == "## Client CPU per 1K streamed tokens"
    header = next(line for line in lines if line.startswith("| figure"))
    assert header == ("| figure (median of 1) | streamed, interval 8 | streamed, interval 1 | "
                      "whole (on_loop = \"off\") |")
    rows = [line.split(" | ")[0] for line in lines if line.startswith("| ") and line is not header]
    assert rows == ["| marginal client CPU per 1K completion tokens (ms)", "| client CPU per 1K tokens, start-up "
                    "included (ms)", "| tokens one core follows (marginal, tok/s)",
                    "| completion tokens of the 6-request run", "| goal (ms per 1K)",
                    "| on the H200 (real SGLang, ms per 1K)"]


def test_a_marginal_below_the_noise_gives_no_rate_one_core_follows() -> None:
    def run(marginal: float) -> dict:
        return {"marginal_ms_per_1k": marginal, "total_ms_per_1k": 5.0, "tokens_long": 900, "wall_long_s": 1.0}
    assert summarise([run(-0.6), run(-0.2), run(3.0)])["median_tokens_per_cpu_s"] is None
    assert summarise([run(8.0), run(10.0), run(12.0)])["median_tokens_per_cpu_s"] == 100_000  # 1e6 / 10 ms per 1K
