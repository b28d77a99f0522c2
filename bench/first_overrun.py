"""The first KV overrun of the long-output regime (issue 19): retractions and throughput per client.

The H200's long regime (bench/sim_vs_real_long.py: 60,000 KV tokens, prompts 300-500, min_tokens 1000,
max_new_tokens 4096) retracts, when it does, at the first overrun 4.5-6 s after a start: SGLang's
first round is small (new_token_ratio 0.7), and when the ratio reaches its floor it admits a cohort all
of one age that grows together. Whether a run overruns depends on the lengths drawn, so one run says
little: this runs every client over `--seeds` synthetic jobs and `--replays` seeded orders of the real
run's lengths, in the simulator (production dispatcher, simulated time, deterministic), and reports
per client the retractions per run, the runs where it retracted no more than all at once (the same
job), and whole-run tok/s against all at once on the same job (paired ratios); also tok/s up to 90 % of
the tokens (the drain's order aside: which requests finish last is luck of the order, and flooding's
retracted requests, queued last with their tokens kept, shorten its drain).

`python -m bench first_overrun [--seeds 20] [--replays 10]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.engine_run import run_traced
from bench.report import md_table, write_section
from bench.sim_vs_real_long import REAL_TRACES, LongServer, job_of_lengths, synthetic_job
from gen_pipeline.controller import ControllerConfig

# name -> (fixed window: an int, "all", or None for the controller; its config)
CLIENTS: dict[str, tuple[int | str | None, ControllerConfig]] = {
    "all at once": ("all", ControllerConfig()),
    "fixed 40": (40, ControllerConfig()),
    "ours": (None, ControllerConfig()),
    "ours, no first-cohort cap": (None, ControllerConfig(cohort_turnover=0.0)),
    "ours, no cap, warm-up queue 1 x running": (None, ControllerConfig(cohort_turnover=0.0, warm_queue_frac=1.0)),
}
HEAD_S = 8.0  # the first overrun falls within this many seconds of the start


def jobs(seeds: int, replays: int) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [(f"synthetic {s}", synthetic_job(300, s)) for s in range(seeds)]
    if replays and REAL_TRACES.exists():
        lengths = json.loads(REAL_TRACES.read_text())["long"]["lengths"]
        out += [(f"real order {s}", job_of_lengths(lengths, s)) for s in range(replays)]
    return out


def one(job, window: int | str | None, config: ControllerConfig) -> dict:
    fixed = len(job.lengths) if window == "all" else window
    result, trace = run_traced(job, LongServer(), fixed, config)
    t90 = next(r["t_s"] for r in trace if r["gen_tokens_total"] >= 0.9 * result.completion_tokens)
    head = [r for r in trace if r["t_s"] <= HEAD_S]
    return {"retractions": result.retractions, "tok_s": round(result.gen_tok_s, 1),
            "tok_s_90": round(0.9 * result.completion_tokens / t90, 1),
            "peak_running": max(r["running"] for r in head), "peak_usage": max(r["token_usage"] for r in head),
            "peak_queued": result.peak_queued}


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    flood = runs["all at once"]
    rows = []
    for name, rs in runs.items():
        ratio = [r["tok_s"] / f["tok_s"] for r, f in zip(rs, flood, strict=True)]
        ratio90 = [r["tok_s_90"] / f["tok_s_90"] for r, f in zip(rs, flood, strict=True)]
        rows.append({
            "client": name, "runs": len(rs),
            "retractions_mean": round(statistics.fmean(r["retractions"] for r in rs), 2),
            "retractions_total": sum(r["retractions"] for r in rs),
            "runs_retracting": sum(1 for r in rs if r["retractions"]),
            "runs_le_all": sum(1 for r, f in zip(rs, flood, strict=True) if r["retractions"] <= f["retractions"]),
            "tok_s_median": round(statistics.median(r["tok_s"] for r in rs)),
            "over_all_mean": round(statistics.fmean(ratio), 4), "over_all_median": round(statistics.median(ratio), 4),
            "over_all_min": round(min(ratio), 3), "over_all_90_mean": round(statistics.fmean(ratio90), 4),
            "peak_running_median": statistics.median(r["peak_running"] for r in rs),
            "peak_queued_max": max(r["peak_queued"] for r in rs)})
    return rows


def markdown(rows: list[dict], seeds: int, replays: int, wall_s: float) -> str:
    table = md_table(
        ["client", "runs", "retractions per run (mean)", "total", "runs that retracted", "runs <= all at once",
         "gen tok/s (median)", "/ all at once, mean (median, min)", "/ all at once up to 90 % of tokens, mean",
         f"peak running in {HEAD_S:g} s (median)", "peak queued"],
        [[r["client"], r["runs"], r["retractions_mean"], r["retractions_total"], r["runs_retracting"],
          r["runs_le_all"], f"{r['tok_s_median']:,}",
          f"{r['over_all_mean']:.4f} ({r['over_all_median']:.4f}, {r['over_all_min']:.3f})",
          f"{r['over_all_90_mean']:.4f}", r["peak_running_median"], r["peak_queued_max"]] for r in rows])
    return ("## The first KV overrun, long outputs (`python -m bench first_overrun`, simulated time)\n\n"
            f"{seeds} synthetic jobs (seeds 0-{seeds - 1}, 300 prompts) and {replays} seeded orders of the real run's "
            "lengths (bench/gpu/h200_traces.json), H200 profile, 60,000 KV tokens; ratios are paired (the same "
            f"job's all at once). Wall {wall_s:.0f} s.\n\n" + table)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--replays", type=int, default=10)
    args = p.parse_args(argv)
    started = time.monotonic()
    js = jobs(args.seeds, args.replays)
    runs = {name: [one(job, window, cfg) for _, job in js] for name, (window, cfg) in CLIENTS.items()}
    rows = summarize(runs)
    wall = time.monotonic() - started
    text = markdown(rows, args.seeds, args.replays, wall)
    print(text)
    out = {"rows": rows, "jobs": [n for n, _ in js], "runs": runs, "wall_s": round(wall, 1)}
    write_section("first_overrun", out, text)
    return out


if __name__ == "__main__":
    main()
