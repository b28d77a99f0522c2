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
when the GPU check has written it (phase `regimes`; the sim replays that run's own lengths; `python -m
bench.sim_vs_real --regime long --traces PATH` takes another run's file), against the figures issue 19
reports from the H200 until then.

Against a trace, the simulator's SPEED is fitted to it, never its scheduler. H200 hosts of the same kind
differed by up to ~30 % in decode rate at the same batch (run 1's and run 3's hosts against run 2's), one
host by ~10 % between rounds, and the ramp after a start is ~1,000 decode steps of SGLang's first admission
round (min_tokens 1000: nothing finishes, and after a refusal nothing more is admitted, `batch_is_full`):
~2 s on one host, ~3 s on another, so one fixed profile puts the ramp where its own host would. Fitted, per
client against the run it is compared with (`fit_speed`): the step-time line of hardware profile "h200"
(`step_base_s`, `decode_per_req_s`; its KV and prefill terms stay) through that run's own two decode
figures (bench/gpu/traces.py `decode_speed`: the step SGLang's gen_throughput gauge shows over the first
admission round, ~13-17 running, and over the steady state, ~40), until the simulated run's gauge reads
the same line within FIT_TOLERANCE at its own batch sizes. Admission, reservation, new_token_ratio,
retraction, the controller: untouched (sglang_sim/engine.py, gen_pipeline/controller/).

The simulated trace is sampled at the real trace's poll offsets (the GPU check's poller keeps its own phase
from the client's start, 0.0-1.0 s; the sim's controller keeps its own polls), so the first round and the
ramp, first polls at or above a level, are quantized alike: at the same offsets a ramp that differs by
less than a second reads 0 or 1.0 s apart, never more (at the sim's old fixed offset, up to 2 s). What one
poll a second cannot resolve: the real client's first request comes up to a second after its start (the
sim's at 0), which can put the real crossing one poll later. Interpolating the crossing between polls does
not resolve it either: the sim's running jumps from the first round to the full batch between two polls,
and an interpolated jump reads where its levels put it, not when it happened (the fit moved the sim's
jump by ~0.3 s without moving the interpolated crossing), so the ramp stays the first poll at or above.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench.engine_run import run_traced
from bench.gpu.traces import COMMITTED, decode_speed, summarize
from bench.jobs import POLL_S, Job, LengthProfile, RunResult
from bench.report import md_table
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import HardwareProfile, get_profile

REAL_TRACES = COMMITTED[0]  # the other committed runs (other days, same setup): their first overruns count too
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
STEADY_LEVELS = ("steady_running_mean", "steady_queued_mean", "steady_usage_mean")
CLIENTS = {"fixed-40": SLOTS_WINDOW, "all": None, "adaptive": 0}  # 0: the controller
FIT_TOLERANCE = 0.01  # the fitted run's decode steps within 1 % of the trace's line at the sim's batch sizes
FIT_ROUNDS = 6


class LongServer:
    """What bench.engine_run needs: a fresh engine at the H200 check's settings."""

    def __init__(self, kv_tokens: int = KV_TOKENS, conservativeness: float = 1.0,
                 profile: HardwareProfile | None = None):
        self.kv_tokens, self.conservativeness = kv_tokens, conservativeness
        self.profile = profile or get_profile("h200")

    def engine(self) -> Engine:
        cfg = EngineConfig(max_total_num_tokens=self.kv_tokens, chunked_prefill_size=CHUNK, context_length=CONTEXT,
                           schedule_conservativeness=self.conservativeness)
        return Engine(cfg, self.profile)


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
    do, as the real runs often did (docs/measurements.md, issue 19). The submission order is not
    recorded; a shuffle stands for it."""
    if seed is not None:
        pairs = list(pairs)
        random.Random(seed).shuffle(pairs)
    return Job(LengthProfile("long", "the real run's lengths", 0, 0, 0, 0, MAX_NEW),
               tuple((p, c, "length" if c >= MAX_NEW else "stop") for p, c in pairs))


Simulate = Callable[[HardwareProfile], tuple[RunResult, list[dict]]]


def run_client(job: Job, client: str, server: LongServer,
               trace_phase_s: float | None = None) -> tuple[RunResult, list[dict]]:
    """One client of CLIENTS through the production dispatcher: the result and the server's trace."""
    window = CLIENTS[client]
    fixed = len(job.lengths) if window is None else (window or None)
    return run_traced(job, server, fixed, trace_phase_s=trace_phase_s)


def figures(result: RunResult, trace: list[dict]) -> dict:
    """A simulated client's figures: whole-run tok/s, retractions, peak queue and the trace summary."""
    return {"tok_s": round(result.gen_tok_s, 1), "retractions": result.retractions,
            "peak_queued": result.peak_queued, **summarize(trace)}


def simulate(job: Job, server: LongServer | None = None) -> dict[str, dict]:
    """Per client: the figures at one server's profile, traced at the controller's polls."""
    server = server or LongServer()
    return {name: figures(*run_client(job, name, server)) for name in CLIENTS}


def step_line(points: list[tuple[float, float]], base: HardwareProfile) -> tuple[float, float]:
    """(seconds a step, seconds per running request) through (batch, step ms) points: the straight line
    through two (per-request term >= 0: a flat line at their mean where the bigger batch stepped faster;
    base term >= 0), `base`'s line scaled through one, `base`'s own through none."""
    base_s, per_s = base.step_base_s, base.decode_per_req_s
    if len(points) == 1:
        (b, t_ms), = points
        scale = t_ms / 1e3 / (base_s + per_s * b)
        return base_s * scale, per_s * scale
    if len(points) == 2:
        (b1, t1), (b2, t2) = sorted(points)
        per = (t2 - t1) / (b2 - b1) if b2 > b1 else 0.0
        if per <= 0:
            return (t1 + t2) / 2e3, 0.0
        if t1 - per * b1 < 0:
            return 0.0, (t1 / b1 + t2 / b2) / 2e3
        return (t1 - per * b1) / 1e3, per / 1e3
    return base_s, per_s


def _points(speed: dict) -> list[tuple[float, float]]:
    return [(speed[f"{k}_batch"], speed[f"{k}_step_ms"]) for k in ("first", "steady")
            if speed.get(f"{k}_batch") and speed.get(f"{k}_step_ms")]


def fit_speed(real_speed: dict, base: HardwareProfile,
              simulate_with: Simulate) -> tuple[HardwareProfile, RunResult, list[dict], dict]:
    """The profile whose simulated run shows the traced host's decode speed (module doc).

    `real_speed` is `decode_speed` of the real trace; `simulate_with(profile)` runs the compared client. Each
    round puts the profile's line through the real points, each divided by what the last simulated run's
    gauge read over the profile's own step at the same batch (the prefill iterations inside gen_throughput's
    window), until the simulated figures are within FIT_TOLERANCE of the real line at the sim's own batch
    sizes. Returns the profile, its run, its trace and what was fitted."""
    target = _points(real_speed)
    line = step_line(target, base)
    profile = base
    result, trace = simulate_with(profile)
    unfitted = figures(result, trace)
    rounds, worst = 0, math.inf
    while target:
        sim_points = _points(decode_speed(trace))
        if len(sim_points) == len(target):
            worst = max(abs(t / (1e3 * (line[0] + line[1] * b)) - 1) for b, t in sim_points)
        if worst <= FIT_TOLERANCE or rounds == FIT_ROUNDS or len(sim_points) != len(target):
            break
        overhead = [t / (1e3 * profile.step_time_s(round(b), 0, 0)) for b, t in sim_points]
        step_base_s, decode_per_req_s = step_line([(b, t / o) for (b, t), o in zip(target, overhead, strict=True)],
                                                  base)
        profile = replace(base, name=f"{base.name} (fitted)", step_base_s=step_base_s,
                          decode_per_req_s=decode_per_req_s)
        result, trace = simulate_with(profile)
        rounds += 1
    info = {"real": real_speed, "sim": decode_speed(trace), "rounds": rounds,
            "max_rel_error": round(worst, 4) if math.isfinite(worst) else None,
            "step_base_ms": round(profile.step_base_s * 1e3, 4),
            "decode_per_req_us": round(profile.decode_per_req_s * 1e6, 3),
            "unfitted": {k: unfitted[k] for k in ("tok_s", "first_round", "ramp_s")}}
    return profile, result, trace, info


def load_real(path: Path = REAL_TRACES) -> dict | None:
    """The long regime of the GPU check's traces: per client, the round with the median tok/s (its summary
    under "clients", its trace under "traces")."""
    if not path.exists():
        return None
    regime = json.loads(path.read_text()).get("long")
    if not regime or not regime.get("runs"):
        return None
    per_client: dict[str, list[dict]] = {}
    for run in regime["runs"]:
        per_client.setdefault(run["client"], []).append(run)
    median = {c: sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2] for c, runs in per_client.items()}
    clients = {c: {"tok_s": r["tok_s"], **summarize(r["trace"])} for c, r in median.items()}
    # The steady levels: the median over the client's rounds, not that one round's (they move +-10 %
    # between rounds of the same client: adaptive's queue read 21-27 over run 4's five)
    for c, runs in per_client.items():
        for key in STEADY_LEVELS:
            vals = [v for v in (summarize(r["trace"]).get(key) for r in runs) if v is not None]
            if vals:
                clients[c][key] = round(statistics.median(vals), 3)
                clients[c][f"{key}_range"] = (min(vals), max(vals))
    return {"source": f"{path.name} ({len(regime['runs'])} runs)", "lengths": regime.get("lengths"),
            "clients": clients, "traces": {c: r["trace"] for c, r in median.items()}}


def first_overrun(trace: list[dict]) -> dict:
    """The start of a run: peak running and token_usage, retractions, within OVERRUN_S of the start."""
    head = [r for r in trace if r["t_s"] - trace[0]["t_s"] <= OVERRUN_S] or trace
    base = trace[0]["retractions_total"] or 0
    return {"peak_running": max(r["running"] for r in head),
            "peak_usage": round(max(r["token_usage"] or 0.0 for r in head), 3),
            "retractions": (head[-1]["retractions_total"] or 0) - base,
            "retractions_run": (trace[-1]["retractions_total"] or 0) - base}


def real_overruns(paths: tuple[Path, ...] = COMMITTED) -> dict[str, list[dict]]:
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
        for name in CLIENTS:
            result, trace = run_client(job, name, LongServer())
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
            ok = rv is not None and sv is not None and round(abs(sv - rv), 6) <= tol
            spread = r.get(f"{key}_range")
            rows.append({"figure": f"{client}: {key}", "real": rv, "sim": sv, "tolerance": round(tol, 3), "ok": ok,
                         "real_rounds": f"{spread[0]}-{spread[1]}" if spread else "-"})
    return rows


def simulate_fitted(job: Job, real: dict, server: LongServer | None = None) -> tuple[dict, dict]:
    """Per client of the real traces: the simulated figures with the speed fitted to that client's run and
    the trace sampled at that run's poll offsets; and each fit."""
    server = server or LongServer()
    sim, fits = {}, {}
    for client, trace in real["traces"].items():
        if client not in CLIENTS or not trace:
            continue
        phase = round(trace[0]["t_s"] % POLL_S, 3)

        def simulate_with(profile: HardwareProfile, client: str = client,
                          phase: float = phase) -> tuple[RunResult, list[dict]]:
            fitted = LongServer(server.kv_tokens, server.conservativeness, profile)
            return run_client(job, client, fitted, trace_phase_s=phase)

        _, result, sim_trace, fits[client] = fit_speed(decode_speed(trace), server.profile, simulate_with)
        fits[client]["poll_offset_s"] = phase
        sim[client] = figures(result, sim_trace)
    return sim, fits


def compare(path: Path = REAL_TRACES) -> dict:
    real = load_real(path)
    job = job_of_lengths(real["lengths"], seed=0) if real and real.get("lengths") else synthetic_job()
    sim, fits = simulate_fitted(job, real) if real else (simulate(job), {})
    rows = checks_against_traces(sim, real) if real else checks_against_issue(sim)
    overruns = overrun_rows(real_overruns(), replay_overruns(real["lengths"])) if real and real.get("lengths") else []
    # the clients' own whole-run rates at one profile ("h200"): fitted, each ran at its own run's speed
    tok_s = {n: (fits[n]["unfitted"] if n in fits else s)["tok_s"] for n, s in sim.items()}
    best = max(v for n, v in tok_s.items() if n != "adaptive")  # the clients the real run had
    return {"source": real["source"] if real else ("the figures of the first long-output H200 runs "
                                               "(no bench/gpu/h200_traces.json yet)"),
            "command": "python -m bench sim_vs_real" + ("" if path == REAL_TRACES else
                                                        f" --regime long --traces bench/gpu/{path.name}"),
            "samples": len(job.lengths), "mean_output": round(statistics.fmean(o for _, o, _ in job.lengths)),
            "sim": sim, "real": real["clients"] if real else None, "fits": fits, "rows": rows,
            "all_ok": all(r["ok"] for r in rows), "overruns": overruns,
            "adaptive_over_best_fixed_sim": round(tok_s["adaptive"] / best, 3),
            "adaptive_over_all_sim": round(tok_s["adaptive"] / tok_s["all"], 3)}


def _speed(f: dict, side: str, part: str) -> str:
    s = f[side]
    return "-" if s[f"{part}_batch"] is None else f"{s[f'{part}_batch']:g} / {s[f'{part}_step_ms']:.2f}"


def fits_markdown(fits: dict[str, dict]) -> str:
    """Per client: the decode figures of the real run and of the fitted simulation, the fitted line, and the
    ramp the unfitted profile gave at the same poll offsets."""
    return md_table(
        ["client", "poll offset s", "first round: running / ms a step, real", "sim", "steady, real", "sim",
         "fitted step (max error)", "ramp s, unfitted \"h200\""],
        [[n, f["poll_offset_s"], _speed(f, "real", "first"), _speed(f, "sim", "first"), _speed(f, "real", "steady"),
          _speed(f, "sim", "steady"),
          f"{f['step_base_ms']:.2f} ms + {f['decode_per_req_us']:.1f} us/request ({f['max_rel_error']})",
          f["unfitted"]["ramp_s"]] for n, f in fits.items()])


def markdown(c: dict) -> str:
    table = md_table(["figure", "real", "real, each round", "sim", "tolerance", "within"],
                     [[r["figure"], r["real"], r.get("real_rounds", "-"), r["sim"], r["tolerance"],
                       "yes" if r["ok"] else "NO"] for r in c["rows"]])
    sim = c["sim"]
    clients = md_table(["client (sim)", "gen tok/s", "first round", "ramp s", "steady running", "steady queued",
                        "queued max", "usage mean / p90", "ratio floor at s", "retractions"],
                       [[n, f"{s['tok_s']:,.0f}", s["first_round"]["running"], s["ramp_s"], s["steady_running_mean"],
                         s["steady_queued_mean"], s["steady_queued_max"], f"{s['usage_mean']} / {s['usage_p90']}",
                         s["ratio_warm_s"], s["retractions"]] for n, s in sim.items()])
    base = get_profile("h200")
    speed = ("hardware profile \"h200\"" if not c["fits"] else
             "hardware profile \"h200\" with its step-time line fitted per client to the real run it is compared with "
             f"(unfitted {base.step_base_s * 1e3:.2f} ms + {base.decode_per_req_s * 1e6:.1f} us/request; the module "
             "doc of bench/sim_vs_real_long.py says what and why), traced at that run's poll offsets")
    fitted = "" if not c["fits"] else (
        "\n\nThe speed fitted (bench/gpu/traces.py `decode_speed`: the step SGLang's gen_throughput gauge shows over "
        "the first admission round and over the steady state, the same reading of both traces):\n\n"
        + fits_markdown(c["fits"]))
    command = c.get("command", "python -m bench sim_vs_real")
    return (f"## Simulator vs real SGLang, long outputs (`{command}`)\n\n"
            f"Real: {c['source']}. Sim: {c['samples']} prompts of 300-500 tokens, outputs mean "
            f"{c['mean_output']:,} (min_tokens 1000, max_new_tokens 4096), 60,000 KV tokens, chunked prefill 8192, "
            f"{speed}; real steady levels: the median over each client's rounds, first round and ramp: the round "
            "with the client's median tok/s (the one its speed is fitted to); "
            f"every figure within its tolerance: {'yes' if c['all_ok'] else 'NO'}. "
            f"Adaptive / the best other client of the real run (sim, \"h200\" for every client): "
            f"{c['adaptive_over_best_fixed_sim']}.\n\n"
            + table + fitted + "\n\n" + clients + _overrun_text(c["overruns"]))


def _overrun_text(rows: list[list]) -> str:
    if not rows:
        return ""
    return (f"\n\nThe first KV overrun: real runs ({', '.join(p.name for p in COMMITTED)}) against the simulator "
            f"replaying the real lengths in {REPLAYS} seeded orders; peaks within {OVERRUN_S:g} s of the start, "
            "retractions over the whole run.\n\n"
            + md_table(["client", "source", "runs", "runs that retracted", "retractions per run (mean)",
                        "retractions per run", "peak running (median)", "peak token_usage (median)",
                        "gen tok/s (median)"], rows))
