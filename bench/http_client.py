"""The HTTP client's CPU per request at the small-model rate (~65 requests/s): the cost we accept for httpx.

The CLI runs as a real subprocess attached to a simulator that answers ~24-token outputs at ~65
requests/s with a fixed window of 14 (fast profile, time scale 0.4: the rate of issue 15's comparison
of aiohttp and httpx). CPU = user + system time of the CLI process from wait4(). A run also pays
fixed costs (imports, `datasets` loading the file, start-up), so the per-request figure that matters
is the marginal one: (CPU of a LONG-request run − CPU of a SHORT-request run) / (LONG − SHORT).
At the real rate (0.3-3 requests/s per node) a figure of c ms per request is c × rate / 10 % of one core.
Both ways a turn travels (issue 22): streamed (the default: SSE, one chunk a token at the simulator's
stream interval of 1, each fed to the loop detector) and whole (`on_loop = "off"`: one JSON answer),
runs alternating so that both see the same load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.overhead import MODES, cli_cpu, short_dataset
from bench.report import md_table, write_section
from sglang_sim.testing import start_sim

REPO = Path(__file__).resolve().parent.parent
SIM_ARGS = ["--sim-profile", "fast", "--time-scale", "0.4", "--sim-output-mean", "24", "--sim-output-spread", "0.3",
            "--max-running-requests", "512", "--sim-startup-s", "0"]
WINDOW, SHORT, LONG = 14, 200, 1500
FLAGS = ("--window", str(WINDOW))
REAL_RATES = (0.3, 3.0)  # requests/s per node in the reference job (issue 20)


def _summary(rows: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    core_share = [round(med["marginal_ms"] * rate / 10, 3) for rate in REAL_RATES]  # ms/req × req/s / 1000 s × 100 %
    return {"runs": rows, "median_marginal_ms_per_request": round(med["marginal_ms"], 3),
            "median_total_ms_per_request": round(med["total_ms"], 3),
            "median_cpu_long_s": round(med["cpu_long_s"], 2), "median_wall_long_s": round(med["wall_long_s"], 1),
            "median_requests_per_s": round(med["requests_per_s"], 1),
            "core_share_percent_at_real_rates": dict(zip([str(r) for r in REAL_RATES], core_share, strict=True))}


def measure(repeats: int) -> dict:
    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="gp-http-") as tmp, start_sim(SIM_ARGS) as sim:
        folder = Path(tmp)
        for mode in MODES:
            cli_cpu(sim.url, short_dataset(folder, SHORT, mode), folder / f"warm-up-{mode}", *FLAGS)
        for rep in range(repeats):
            for mode in MODES:  # alternating: both modes see the same load on a shared machine
                short = cli_cpu(sim.url, short_dataset(folder, SHORT, mode), folder / f"out-{mode}-s{rep}", *FLAGS)
                long = cli_cpu(sim.url, short_dataset(folder, LONG, mode), folder / f"out-{mode}-l{rep}", *FLAGS)
                rows[mode].append({"cpu_short_s": short[0], "cpu_long_s": long[0], "wall_long_s": long[1],
                                   "requests_per_s": LONG / long[1],
                                   "marginal_ms": 1000 * (long[0] - short[0]) / (LONG - SHORT),
                                   "total_ms": 1000 * long[0] / LONG})
    pairs = [s["marginal_ms"] / w["marginal_ms"] for s, w in zip(rows["streamed"], rows["whole"], strict=True)
             if w["marginal_ms"] > 0]
    return {"window": WINDOW, "requests_short": SHORT, "requests_long": LONG, "repeats": repeats,
            **{mode: _summary(r) for mode, r in rows.items()},
            "streamed_over_whole_marginal": round(statistics.median(pairs), 2) if pairs else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.http_client", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    r = measure(ap.parse_args(argv).repeats)
    s, w = r["streamed"], r["whole"]

    def share(x: dict) -> str:
        lo, hi = x["core_share_percent_at_real_rates"].values()
        return f"{lo}-{hi} %"

    table = md_table([f"figure (median of {r['repeats']})", "streamed (default)", "whole (on_loop = \"off\")"], [
        [f"client CPU of a {LONG}-request run (user + sys, s)", s["median_cpu_long_s"], w["median_cpu_long_s"]],
        ["client CPU per request, start-up included (ms)", s["median_total_ms_per_request"],
         w["median_total_ms_per_request"]],
        [f"marginal client CPU per request ({LONG} − {SHORT} requests) (ms)", s["median_marginal_ms_per_request"],
         w["median_marginal_ms_per_request"]],
        ["requests/s reached", s["median_requests_per_s"], w["median_requests_per_s"]],
        [f"wall time of the {LONG}-request run (s)", s["median_wall_long_s"], w["median_wall_long_s"]],
        [f"share of one core at {REAL_RATES[0]}-{REAL_RATES[1]} requests/s per node", share(s), share(w)],
    ])
    md = (f"## HTTP client CPU per request at ~65 requests/s (httpx, the cost we accept)\n\n"
          f"`python -m bench http_client`: the CLI attached to the simulator (`{' '.join(SIM_ARGS)}`), fixed window "
          f"{WINDOW}, one-turn samples of `max_new_tokens = 32` (~24-token answers); CPU of the whole client process "
          "(HTTP, dispatch, parsing, writing) from wait4(); marginal = "
          f"(CPU of a {LONG}-request run − CPU of a {SHORT}-request run) / {LONG - SHORT}. Streamed = the default "
          "(SSE, one chunk a token at the simulator's stream interval of 1, each fed to the loop "
          "detector); whole = `[generation] on_loop = \"off\"` (one JSON answer a turn, no loop detector); the two "
          f"alternate run by run. Streamed / whole, marginal, pair by pair (median): "
          f"{r['streamed_over_whole_marginal']}x. Shared 2-core machine: "
          "the section \"HTTP client library\" below pairs runs for the comparisons with aiohttp.\n\n" + table)
    print(md)
    write_section("http_client", r, md)


if __name__ == "__main__":
    main()
