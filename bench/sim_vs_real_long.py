"""Simulator vs real SGLang in the long-output regime (issue 19), per-second traces.

The regime: the H200 check's server (60,000 bf16 KV tokens, the random 1.16B Llama, context 8192),
prompts of ~300-500 tokens, max_new_tokens 4096 with min_tokens 1000 (every output >= 1,000, mean
~1,300: EOS has probability ~1/320 a token), so only ~40 requests fit. Clients: a fixed window at
about the slot count (40), everything at once, and the adaptive controller, each through the
production dispatcher in simulated time (bench/engine_run.py), hardware profile "h200".

What is compared (bench/gpu/traces.py reads real and simulated traces the same way): the first
admission round, the ramp (seconds until running reaches 90 % of the steady median), the steady
state (running, queued, token_usage), how fast new_token_ratio falls to its floor, retractions,
the decode rate. Tolerances (issue 19): running and queued within 10 % in steady state,
token_usage within 0.05, first round and ramp within a second. Against bench/gpu/h200_traces.json
when the GPU check has written it (phase `regimes`; the sim replays that run's own lengths),
against the figures issue 19 reports from the H200 until then.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

from bench.engine_run import run_traced
from bench.gpu.traces import summarize
from bench.jobs import Job, LengthProfile
from bench.report import md_table
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import get_profile

REAL_TRACES = Path(__file__).resolve().parent / "gpu" / "h200_traces.json"
# Earlier rounds of the same phase (other days, same setup): their first overruns count too.
REAL_TRACES_MORE = tuple(Path(__file__).resolve().parent / "gpu" / f"h200_traces_run{n}.json" for n in (3, 2))
REPLAYS = 10  # seeded submission orders of the real lengths for the first-overrun comparison
OVERRUN_S = 12.0  # the first overrun (and a second wave) fall within this many seconds of a start
KV_TOKENS, CHUNK, CONTEXT, MAX_NEW, MIN_TOKENS = 60_000, 8192, 8192, 4096, 1000
PROMPTS = 400  # the GPU phase's long runs (bench/gpu/setup.py LONG_PROMPTS)
SLOTS_WINDOW = 40  # about the slot count on the H200
EOS_MEAN = 320  # tokens after min_tokens: the random model's EOS comes with probability ~1/320
# Issue 19: real SGLang 0.5.17 on the H200 in this regime (300- and 900-prompt runs, /metrics once a
# second): [low, high] of what the runs showed.
ISSUE_19 = {
    "first_round": (13, 16),  # running after SGLang's first admission round(s)
    "ramp_s fixed": (2.0, 3.0),  # a fixed window: seconds to 90 % of the steady batch
    "steady running all": (38.9, 39.2),  # flooding
    "usage mean all": (0.63, 0.70),  # whole run
    "usage p90 all": (0.0, 0.82),
    # new_token_ratio 0.7 -> ~0.1 "within ~2 s of decoding"; the gauge is the last prefill round's,
    # polled once a second
    "ratio_warm_s": (1.5, 2.5),
    "retractions all": (0, 3),
    "steady gen tok/s all": (9_700.0, 11_000.0),
}
CLIENTS = {"fixed-40": SLOTS_WINDOW, "all": None, "adaptive": 0}  # 0: the controller


class LongServer:
    """What bench.engine_run needs: a fresh engine at the H200 check's settings."""

    def __init__(self, kv_tokens: int = KV_TOKENS, conservativeness: float = 1.0):
        self.kv_tokens, self.conservativeness = kv_tokens, conservativeness

    def engine(self) -> Engine:
        cfg = EngineConfig(max_total_num_tokens=self.kv_tokens, chunked_prefill_size=CHUNK, context_length=CONTEXT,
                           schedule_conservativeness=self.conservativeness)
        return Engine(cfg, get_profile("h200"))


def synthetic_job(samples: int = PROMPTS, seed: int = 19) -> Job:
    """Prompts uniform in 300-500 tokens; outputs min_tokens + geometric(EOS_MEAN), capped at max_new."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(samples):
        extra = int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / EOS_MEAN))
        out = min(MAX_NEW, MIN_TOKENS + extra)
        lengths.append((rng.randint(300, 500), out, "length" if out >= MAX_NEW else "stop"))
    return Job(LengthProfile("long", "issue 19's long regime", 0, 0, 0, 0, MAX_NEW), tuple(lengths))


def job_of_lengths(pairs: list[list[int]], seed: int | None = None) -> Job:
    """The real run's [prompt, completion] pairs as a job; `seed`: in a seeded random order.

    bench/gpu/runs.lengths reads them from the shards, which are written as requests finish: in that
    order the replay's first round is the real run's first finishers (outputs 1,001-1,986 tokens,
    spread), which never overran the pool in the simulator, while most shuffles of the same lengths
    do, as the real runs often did (bench/RESULTS.md, issue 19). The submission order is not
    recorded; a shuffle stands for it."""
    if seed is not None:
        pairs = list(pairs)
        random.Random(seed).shuffle(pairs)
    return Job(LengthProfile("long", "the real run's lengths", 0, 0, 0, 0, MAX_NEW),
               tuple((p, c, "length" if c >= MAX_NEW else "stop") for p, c in pairs))


def simulate(job: Job, server: LongServer | None = None) -> dict[str, dict]:
    """Per client: whole-run tok/s and the trace summary."""
    server = server or LongServer()
    out = {}
    for name, window in CLIENTS.items():
        fixed = len(job.lengths) if window is None else (window or None)
        result, trace = run_traced(job, server, fixed)
        out[name] = {"tok_s": round(result.gen_tok_s, 1), "retractions": result.retractions,
                     "peak_queued": result.peak_queued, **summarize(trace)}
    return out


def load_real(path: Path = REAL_TRACES) -> dict | None:
    """The long regime of the GPU check's traces: per client, the round with the median tok/s."""
    if not path.exists():
        return None
    regime = json.loads(path.read_text()).get("long")
    if not regime or not regime.get("runs"):
        return None
    per_client: dict[str, list[dict]] = {}
    for run in regime["runs"]:
        per_client.setdefault(run["client"], []).append(run)
    median = {c: sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2] for c, runs in per_client.items()}
    return {"source": f"{path.name} ({len(regime['runs'])} runs)", "lengths": regime.get("lengths"),
            "clients": {c: {"tok_s": r["tok_s"], **summarize(r["trace"])} for c, r in median.items()}}


def first_overrun(trace: list[dict]) -> dict:
    """The start of a run: peak running and token_usage, retractions, within OVERRUN_S of the start."""
    head = [r for r in trace if r["t_s"] - trace[0]["t_s"] <= OVERRUN_S] or trace
    base = trace[0]["retractions_total"] or 0
    return {"peak_running": max(r["running"] for r in head),
            "peak_usage": round(max(r["token_usage"] or 0.0 for r in head), 3),
            "retractions": (head[-1]["retractions_total"] or 0) - base,
            "retractions_run": (trace[-1]["retractions_total"] or 0) - base}


def real_overruns(paths: tuple[Path, ...] = (REAL_TRACES, *REAL_TRACES_MORE)) -> dict[str, list[dict]]:
    """first_overrun() of every real long run, per client."""
    out: dict[str, list[dict]] = {}
    for path in paths:
        if path.exists():
            for run in (json.loads(path.read_text()).get("long") or {}).get("runs", []):
                out.setdefault(run["client"], []).append({**first_overrun(run["trace"]), "tok_s": run["tok_s"]})
    return out


def replay_overruns(pairs: list[list[int]], replays: int = REPLAYS) -> dict[str, list[dict]]:
    """first_overrun() and whole-run tok/s per client over `replays` seeded orders of the real lengths."""
    out: dict[str, list[dict]] = {name: [] for name in CLIENTS}
    for seed in range(replays):
        job = job_of_lengths(pairs, seed)
        for name, window in CLIENTS.items():
            fixed = len(job.lengths) if window is None else (window or None)
            result, trace = run_traced(job, LongServer(), fixed)
            out[name].append({**first_overrun(trace), "tok_s": round(result.gen_tok_s, 1)})
    return out


def overrun_rows(real: dict[str, list[dict]], sim: dict[str, list[dict]]) -> list[list]:
    """Per client, real runs against replays: runs that retracted, retractions per run, peaks."""
    def cell(runs: list[dict], key: str) -> str:
        return " / ".join(f"{r[key]:g}" for r in runs) if runs else "-"

    rows = []
    for client in CLIENTS:
        for source, runs in (("real", real.get(client, [])), ("sim", sim.get(client, []))):
            if not runs:
                continue
            rows.append([client, source, len(runs), sum(1 for r in runs if r["retractions_run"]),
                         round(statistics.fmean(r["retractions_run"] for r in runs), 2), cell(runs, "retractions_run"),
                         statistics.median(r["peak_running"] for r in runs),
                         round(statistics.median(r["peak_usage"] for r in runs), 3),
                         f"{statistics.median(r['tok_s'] for r in runs):,.0f}"])
    return rows


def checks_against_issue(sim: dict[str, dict]) -> list[dict]:
    """The issue's figures, each with the simulator's value and the tolerance it is held to."""
    f, a, ad = sim["fixed-40"], sim["all"], sim["adaptive"]

    def row(name: str, value: float | None, lo: float, hi: float, tol: float, unit: str = "") -> dict:
        ok = value is not None and lo - tol <= value <= hi + tol
        return {"figure": name, "real": f"{lo:g}-{hi:g}{unit}", "sim": value, "tolerance": tol, "ok": ok}

    lo, hi = ISSUE_19["steady running all"]
    return [
        row("first admission round (all at once), running", a["first_round"]["running"], *ISSUE_19["first_round"], 0),
        row("ramp to 90 % of the batch, fixed 40 (s)", f["ramp_s"], *ISSUE_19["ramp_s fixed"], 1.0),
        row("ramp to 90 % of the batch, adaptive (s)", ad["ramp_s"], *ISSUE_19["ramp_s fixed"], 1.0),
        row("steady running, all at once", a["steady_running_mean"], lo, hi, 0.1 * lo),
        row("token_usage mean, all at once (whole run)", a["usage_mean"], *ISSUE_19["usage mean all"], 0.05),
        row("token_usage p90, all at once", a["usage_p90"], *ISSUE_19["usage p90 all"], 0.05),
        row("new_token_ratio at its floor after (s)", a["ratio_warm_s"], *ISSUE_19["ratio_warm_s"], 1.0),
        row("retractions, all at once", a["retractions"], *ISSUE_19["retractions all"], 0),
        row("steady decode tok/s, all at once", a["steady_gen_throughput_mean"], *ISSUE_19["steady gen tok/s all"],
            0.05 * 11_000),
    ]


def checks_against_traces(sim: dict[str, dict], real: dict) -> list[dict]:
    """Per client in both: steady running / queued within 10 %, usage within 0.05, first round and ramp
    within a second."""
    rows = []
    for client, r in real["clients"].items():
        s = sim.get(client)
        if s is None:
            continue
        for key, kind in (("steady_running_mean", "rel"), ("steady_queued_mean", "rel"),
                          ("steady_usage_mean", "abs"), ("ramp_s", "s"), ("first_round", "s")):
            rv, sv = r.get(key), s.get(key)
            if key == "first_round":
                rv, sv = (rv or {}).get("t_s"), (sv or {}).get("t_s")
            tol = {"rel": 0.1 * abs(rv or 0) + (1.0 if key == "steady_queued_mean" else 0.0),
                   "abs": 0.05, "s": 1.0}[kind]
            ok = rv is not None and sv is not None and abs(sv - rv) <= tol
            rows.append({"figure": f"{client}: {key}", "real": rv, "sim": sv, "tolerance": round(tol, 3), "ok": ok})
    return rows


def compare() -> dict:
    real = load_real()
    job = job_of_lengths(real["lengths"], seed=0) if real and real.get("lengths") else synthetic_job()
    sim = simulate(job)
    rows = checks_against_traces(sim, real) if real else checks_against_issue(sim)
    overruns = overrun_rows(real_overruns(), replay_overruns(real["lengths"])) if real and real.get("lengths") else []
    best = max(sim["fixed-40"]["tok_s"], sim["all"]["tok_s"])
    return {"source": real["source"] if real else "issue 19's figures (no bench/gpu/h200_traces.json yet)",
            "samples": len(job.lengths), "mean_output": round(statistics.fmean(o for _, o, _ in job.lengths)),
            "sim": sim, "real": real["clients"] if real else None, "rows": rows,
            "all_ok": all(r["ok"] for r in rows), "overruns": overruns,
            "adaptive_over_best_fixed_sim": round(sim["adaptive"]["tok_s"] / best, 3),
            "adaptive_over_all_sim": round(sim["adaptive"]["tok_s"] / sim["all"]["tok_s"], 3)}


def markdown(c: dict) -> str:
    table = md_table(["figure", "real", "sim", "tolerance", "within"],
                     [[r["figure"], r["real"], r["sim"], r["tolerance"], "yes" if r["ok"] else "NO"]
                      for r in c["rows"]])
    sim = c["sim"]
    clients = md_table(["client (sim)", "gen tok/s", "first round", "ramp s", "steady running", "steady queued",
                        "queued max", "usage mean / p90", "ratio floor at s", "retractions"],
                       [[n, f"{s['tok_s']:,.0f}", s["first_round"]["running"], s["ramp_s"], s["steady_running_mean"],
                         s["steady_queued_mean"], s["steady_queued_max"], f"{s['usage_mean']} / {s['usage_p90']}",
                         s["ratio_warm_s"], s["retractions"]] for n, s in sim.items()])
    return ("## Simulator vs real SGLang, long outputs (`python -m bench sim_vs_real`, issue 19)\n\n"
            f"Real: {c['source']}. Sim: {c['samples']} prompts of 300-500 tokens, outputs mean "
            f"{c['mean_output']:,} (min_tokens 1000, max_new_tokens 4096), 60,000 KV tokens, chunked prefill 8192, "
            f"hardware profile \"h200\"; every figure within its tolerance: {'yes' if c['all_ok'] else 'NO'}. "
            f"Adaptive / best of fixed 40 and all at once (sim): {c['adaptive_over_best_fixed_sim']}.\n\n"
            + table + "\n\n" + clients + _overrun_text(c["overruns"]))


def _overrun_text(rows: list[list]) -> str:
    if not rows:
        return ""
    return ("\n\nThe first KV overrun: real runs (h200_traces.json and _run2) against the simulator replaying "
            f"the real lengths in {REPLAYS} seeded orders; peaks within {OVERRUN_S:g} s of the start, "
            "retractions over the whole run.\n\n"
            + md_table(["client", "source", "runs", "runs that retracted", "retractions per run (mean)",
                        "retractions per run", "peak running (median)", "peak token_usage (median)",
                        "gen tok/s (median)"], rows))
