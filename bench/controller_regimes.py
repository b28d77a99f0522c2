"""Controller benchmark of issue 19: the adaptive window against fixed windows and SGLang's own
scheduler fed everything at once, in the regimes the H200 showed, and at the 88K job's scale.

Every client is the production dispatcher (gen_pipeline.run.dispatch with the Controller, or a fixed
window) against the simulator's engine in simulated time (bench/engine_run.py), deterministic.

1. H200 profile ("h200", 60,000 KV tokens, chunked prefill 8192): short outputs (the issue-9 run's own
   1,500 lengths, max 512); long outputs (issue 19: prompts 300-500, min_tokens 1000, mean ~1,330,
   max_new_tokens 4096), 300 and 900 prompts; long outputs with eager admission
   (--schedule-conservativeness 0.3: SGLang retracts), 300 and 900 prompts; a starved pool (20,000
   tokens, short outputs), default and eager. Figures: whole-run tok/s, retractions, the largest queue
   the server held, the seconds to 90 % of the steady batch.
2. The 88K job's scale with the seed's profile: B2 (the KV-bound dataset; long reasoning, max_new 8192)
   at a tenth of its 18,000 samples (bench/job_bench.py's scale), on the seed's three pools, three job
   seeds: ours / all at once.

`python -m bench controller_regimes [--quick]`; --quick runs the long 300-prompt cell only, writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from bench import sim_vs_real as svr
from bench import sim_vs_real_long as long_regime
from bench.engine_run import run_traced
from bench.gpu.traces import summarize
from bench.jobs import LENGTH_PROFILES, SERVER_CONFIGS, Job
from bench.report import md_table, write_section
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import get_profile

B2_SCALE_SAMPLES = 1800  # the 88K job's B2 (18,000) at bench/job_bench.py's scale (1/10)
SEEDS = (1, 2, 3)


class _Starved:
    """The GPU check's starved profiles: 20,000 KV tokens, context 4096, h200 hardware."""

    def __init__(self, conservativeness: float = 1.0):
        self.conservativeness = conservativeness

    def engine(self) -> Engine:
        return Engine(EngineConfig(max_total_num_tokens=20_000, chunked_prefill_size=8192, context_length=4096,
                                   schedule_conservativeness=self.conservativeness), get_profile("h200"))


class _OverCeiling:
    """Issue 34's short regime past SGLang's CUDA-graph ceiling: 120,000 fp8 KV tokens on one GPU (decode
    graphs up to batch 256, SGLang's default there), so SGLang's own admission runs ~300 short requests."""

    def engine(self) -> Engine:
        return Engine(EngineConfig(max_total_num_tokens=120_000, chunked_prefill_size=8192, context_length=4096,
                                   cuda_graph_max_bs=256), get_profile("h200", "fp8_e4m3"))


def _over_ceiling_job() -> Job:
    """3,000 short requests: the issue-9 run's 1,500 lengths twice (max 512, EOS honoured)."""
    job = _short_job()
    return Job(job.profile, (job.lengths * 2)[:3000])


def _short_job(n: int | None = None) -> Job:
    job = svr.job_of(svr.load_real())
    return Job(job.profile, job.lengths[:n]) if n else job


def _cells() -> dict[str, tuple]:
    real = svr.load_real()
    h200 = svr.H200Server(real, get_profile("h200"))
    return {
        "short (60K, max 512)": (_short_job(), h200, (64, 128, 256)),
        "long, 300 prompts": (long_regime.synthetic_job(300), long_regime.LongServer(), (32, 40, 64, 150)),
        "long, 900 prompts": (long_regime.synthetic_job(900), long_regime.LongServer(), (32, 40, 64, 150)),
        "long, eager admission (0.3)": (long_regime.synthetic_job(300), long_regime.LongServer(conservativeness=0.3),
                                        (40, 64)),
        "long, 900 prompts, eager admission (0.3)": (long_regime.synthetic_job(900),
                                                     long_regime.LongServer(conservativeness=0.3), (40, 64)),
        "short over the graph ceiling (120K fp8, 3,000, max 512)": (_over_ceiling_job(), _OverCeiling(),
                                                                   (64, 128, 192, 256)),
        "starved (20K, max 512)": (_short_job(1000), _Starved(), (64, 256)),
        "starved, eager admission (0.3)": (_short_job(1000), _Starved(0.3), (64, 256)),
    }


def _one(job: Job, server, window: int | None) -> dict:
    result, trace = run_traced(job, server, window)
    s = summarize(trace)
    return {"tok_s": round(result.gen_tok_s, 1), "retractions": result.retractions, "peak_queued": result.peak_queued,
            "ramp_s": s.get("ramp_s"), "steady_running": s.get("steady_running_mean"),
            "steady_queued": s.get("steady_queued_mean"), "makespan_s": round(result.makespan_s, 1)}


def run_cell(name: str) -> dict:
    job, server, windows = _cells()[name]
    runs = {f"fixed {w}": _one(job, server, w) for w in windows}
    runs["all at once"] = _one(job, server, len(job.lengths))
    runs["ours"] = _one(job, server, None)
    others = {k: v for k, v in runs.items() if k != "ours"}
    best = max(others, key=lambda k: others[k]["tok_s"])
    return {"cell": name, "samples": len(job.lengths), "runs": runs, "best": best,
            "ours_over_best": round(runs["ours"]["tok_s"] / others[best]["tok_s"], 4),
            "ours_over_all": round(runs["ours"]["tok_s"] / runs["all at once"]["tok_s"], 4),
            "ours_retractions_le_all": runs["ours"]["retractions"] <= runs["all at once"]["retractions"]}


def run_b2(server: str, seed: int, samples: int = B2_SCALE_SAMPLES) -> dict:
    job = Job.sample(LENGTH_PROFILES["B2"], samples, seed)
    config = SERVER_CONFIGS[server]
    ours, flood = _one(job, config, None), _one(job, config, samples)
    return {"server": server, "seed": seed, "samples": samples, "ours": ours, "all at once": flood,
            "ours_over_all": round(ours["tok_s"] / flood["tok_s"], 4)}


def markdown(cells: list[dict], b2: list[dict], wall_s: float) -> str:
    rows = []
    for c in cells:
        for name, r in c["runs"].items():
            rows.append([c["cell"], name, f"{r['tok_s']:,.0f}", r["retractions"], r["peak_queued"], r["ramp_s"],
                         r["steady_running"], r["steady_queued"]])
    ratios = [[c["cell"], c["samples"], c["best"], f"**{c['ours_over_best']:.3f}**", f"{c['ours_over_all']:.3f}",
               "yes" if c["ours_retractions_le_all"] else "no"] for c in cells]
    b2_rows = []
    for server in SERVER_CONFIGS:
        mine = [x for x in b2 if x["server"] == server]
        if not mine:
            continue
        per_seed = " / ".join(f"{x['ours_over_all']:.3f}" for x in mine)
        b2_rows.append([server, len(mine), per_seed, f"**{statistics.median(x['ours_over_all'] for x in mine):.3f}**",
                        " / ".join(str(x["ours"]["retractions"]) for x in mine),
                        " / ".join(str(x["all at once"]["retractions"]) for x in mine),
                        " / ".join(str(x["ours"]["peak_queued"]) for x in mine)])
    return ("## Controller in SGLang's regimes (`python -m bench controller_regimes`, simulated time)\n\n"
            "The production dispatcher against the simulator's scheduler (SGLang 0.5.17's admission, "
            "sglang_sim/engine.py). H200 profile: adaptive / the best of the fixed windows and all at once; "
            "ramp = seconds to 90 % of the steady running count. Wall "
            f"{wall_s:.0f} s.\n\n"
            + md_table(["regime", "samples", "best other", "ours / best", "ours / all at once",
                        "ours retracts <= all at once"], ratios) + "\n\n"
            + md_table(["regime", "client", "gen tok/s", "retractions", "peak queued", "ramp s", "steady running",
                        "steady queued"], rows)
            + f"\n\nThe 88K job's scale, seed profile: B2 ({B2_SCALE_SAMPLES:,} samples, a tenth of the job's "
            "18,000, as bench/job_bench.py), num_continuous_decode_steps 4, three job seeds:\n\n"
            + md_table(["KV", "seeds", "ours / all at once per seed", "median", "ours retractions",
                        "all-at-once retractions", "ours peak queued"], b2_rows))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the long 300-prompt cell only, nothing written")
    p.add_argument("--cell", action="append", default=[], help="run only this cell (repeatable), nothing written")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)
    started = time.monotonic()
    if args.quick or args.cell:
        cells = [run_cell(name) for name in args.cell or ["long, 300 prompts"]]
        print(markdown(cells, [], time.monotonic() - started))
        return {"cells": cells}
    workers = args.workers or max(1, min(2, os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        cells_f = [pool.submit(run_cell, name) for name in _cells()]
        b2_f = [pool.submit(run_b2, server, seed) for server in SERVER_CONFIGS for seed in SEEDS]
        cells, b2 = [f.result() for f in cells_f], [f.result() for f in b2_f]
    wall = time.monotonic() - started
    text = markdown(cells, b2, wall)
    print(text)
    out = {"cells": cells, "b2_88k_scale": b2, "wall_s": round(wall, 1),
           "b2_ours_over_all_median": {s: statistics.median(x["ours_over_all"] for x in b2 if x["server"] == s)
                                       for s in SERVER_CONFIGS}}
    write_section("controller_regimes", out, text)
    return out


if __name__ == "__main__":
    main()
