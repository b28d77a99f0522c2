"""Simulator vs the real H200 run (issue 9): the same fixed-window sweep and adaptive, side by side.

The real figures come from the committed results of the GPU check (bench/gpu/h200_results.json,
made by bench/gpu/run_h200.sh); the job replayed in the simulator is that run's own prompt and
output lengths, its KV pool and SGLang's chunked-prefill and max-running settings as the server
logged them. Simulated time, deterministic, hardware profile "h200" (sglang_sim/profiles.py).
Target: every window within 10 % of the real throughput, the same best window.

`python -m bench.sim_vs_real` prints and writes section "sim_vs_real" (this short-output regime) and
section "sim_vs_real_long" (the long-output regime of issue 19, bench/sim_vs_real_long.py);
`--regime short|long` runs one; `--traces PATH` compares the long regime with another GPU run's
traces (default bench/gpu/h200_traces.json; the section says which file); `--fit` prints the
step-time coefficients that reproduce the real sweep (least squares over the fixed windows,
non-negative), for recalibrating the profile after a new GPU run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench import sim_vs_real_long
from bench.engine_run import run
from bench.jobs import Job, LengthProfile, RunResult
from bench.report import md_table, write_section
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import HardwareProfile, get_profile

REAL_RESULTS = Path(__file__).resolve().parent / "gpu" / "h200_results.json"
# The first H200 run (issue 9, ../shared/gpu/README.md): the same setup, before bench/gpu existed.
EARLIER = {"32": 8607.0, "64": 13230.0, "128": 15712.0, "256": 14746.0, "all": 14339.0}
EARLIER_ADAPTIVE = [16253.0, 15980.0, 16877.0, 14348.0]
WINDOWS = ("32", "64", "128", "256", "all")
TOLERANCE = 0.10
MAX_NEW_TOKENS = 512
_CAP = re.compile(r"(\w+)=(\d+)")
NOTE = ("Where it differs: the sim puts 256 / all at once (KV-bound: SGLang's admission holds ~140 running, "
        "no retraction, as on the H200) 3 % above 128; the two real runs put them 2-8 % below, but the same "
        "real client moved 18 % between the runs (all at once: 14,339 then 16,985) and within one session "
        "256 and all at once ended 14 % apart at the same running count and server-side decode rate. The "
        "scheduler-level figures the model owns match (running at every window, zero retractions); the order "
        "of 128 / 256 / all is inside the H200's run-to-run spread, so the step-time model was not bent to it.")


@dataclass(frozen=True)
class RealRun:
    source: str
    fixed_tok_s: dict[str, float]
    adaptive_tok_s: list[float]
    lengths: list[tuple[int, int]]
    kv_tokens: int
    chunked_prefill_size: int
    max_running_requests: int
    running: dict[str, float] | None = None  # the server's median running requests per window


def mean_real(real: RealRun) -> RealRun:
    """The target: per window the mean of this run and the first run (single runs differ by up to
    ~15 % at the KV-bound windows: all at once gave 14,339 then 16,985 tok/s), adaptive pooled."""
    if real.fixed_tok_s == EARLIER:
        return real
    fixed = {k: round((real.fixed_tok_s[k] + EARLIER[k]) / 2, 1) for k in WINDOWS}
    return replace(real, fixed_tok_s=fixed, adaptive_tok_s=real.adaptive_tok_s + EARLIER_ADAPTIVE,
                   source=real.source + " and the first run, averaged")


def load_real(path: Path = REAL_RESULTS) -> RealRun:
    """The real run's figures; without a results file, the first run's figures on a synthetic job."""
    if not path.exists():
        rng = random.Random(9)
        synthetic = [(max(40, round(rng.lognormvariate(math.log(200), 0.35))),
                      min(MAX_NEW_TOKENS, 1 + int(rng.expovariate(1 / 319)))) for _ in range(1500)]
        return RealRun("issue 9's first run (no bench/gpu/h200_results.json yet; synthetic job)", EARLIER,
                       EARLIER_ADAPTIVE, synthetic, 60_000, 8192, 4096)
    r = json.loads(path.read_text())
    cap = dict((k, int(v)) for k, v in _CAP.findall(r.get("serve", {}).get("capacity") or ""))
    return RealRun(f"{path.name} ({r.get('date', 'H200 run')})", {k: v["tok_s"] for k, v in r["sweep"].items()},
                   [a["tok_s"] for a in r.get("adaptive", [])], [tuple(x) for x in r["lengths"]],
                   cap.get("max_total_num_tokens", 60_000), cap.get("chunked_prefill_size", 8192),
                   cap.get("max_running_requests", 4096),
                   {k: (v.get("server_metrics") or {}).get("median sglang:num_running_reqs")
                    for k, v in r["sweep"].items()})


class H200Server:
    """What bench.engine_run.run needs: a fresh engine at the real run's settings."""

    def __init__(self, real: RealRun, profile: HardwareProfile):
        self.real, self.profile = real, profile

    def engine(self) -> Engine:
        cfg = EngineConfig(max_total_num_tokens=self.real.kv_tokens,
                           max_running_requests=self.real.max_running_requests,
                           chunked_prefill_size=self.real.chunked_prefill_size, num_continuous_decode_steps=1,
                           context_length=4096)
        return Engine(cfg, self.profile)


def job_of(real: RealRun) -> Job:
    profile = LengthProfile("h200", "the real run's lengths", 0, 0, 0, 0, MAX_NEW_TOKENS)
    return Job(profile, tuple((p, o, "length" if o >= MAX_NEW_TOKENS else "stop") for p, o in real.lengths))


def window_of(key: str, job: Job) -> int:
    return len(job.lengths) if key == "all" else int(key)


def simulate(real: RealRun, profile: HardwareProfile) -> tuple[dict[str, RunResult], RunResult]:
    job, server = job_of(real), H200Server(real, profile)
    fixed = {k: run(job, server, fixed=window_of(k, job))[0] for k in WINDOWS}
    ours = run(job, server)[0]  # the production dispatcher with the controller
    return fixed, ours


class _Recorder(HardwareProfile):
    """A profile that sums what each step is charged for; the fixed-window trajectories do not
    depend on step times (the client refills at once), so makespan is linear in the coefficients."""

    def __init__(self, base: HardwareProfile):
        object.__setattr__(self, "_sums", np.zeros(4))
        super().__init__(**{f: getattr(base, f) for f in base.__dataclass_fields__})

    def step_time_s(self, batch_size: int, kv_tokens: int, prefill_tokens: int, graph: bool = True) -> float:
        self._sums += (1.0, batch_size, kv_tokens, prefill_tokens)
        return super().step_time_s(batch_size, kv_tokens, prefill_tokens, graph)


def fit(real: RealRun, base: HardwareProfile) -> tuple[HardwareProfile, dict[str, float]]:
    """Non-negative least squares of relative makespan error over the fixed windows."""
    job, rows, targets = job_of(real), [], []
    for key in WINDOWS:
        rec = _Recorder(base)
        result = run(job, H200Server(real, rec), fixed=window_of(key, job))[0]
        rows.append(rec._sums / (result.completion_tokens / real.fixed_tok_s[key]))
        targets.append(1.0)
    a, b = np.array(rows), np.array(targets)
    best, best_err = np.zeros(4), math.inf
    for active in itertools.chain.from_iterable(itertools.combinations(range(4), k) for k in range(1, 5)):
        cols = list(active)
        theta, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (theta < 0).any():
            continue
        full = np.zeros(4)
        full[cols] = theta
        err = float(np.abs(a @ full - b).max())
        if err < best_err:
            best, best_err = full, err
    fitted = replace(base, step_base_s=float(best[0]), decode_per_req_s=float(best[1]),
                     decode_per_kv_token_s=float(best[2]), prefill_per_token_s=float(best[3]))
    return fitted, {"max_rel_makespan_error": round(best_err, 4)}


def compare(real: RealRun, fixed: dict[str, RunResult], ours: RunResult, this_run: dict[str, float]) -> dict:
    rows = []
    for k in WINDOWS:
        sim, meas = fixed[k].gen_tok_s, real.fixed_tok_s.get(k)
        rows.append({"window": k, "real_tok_s": meas, "this_run_tok_s": this_run.get(k), "earlier_tok_s": EARLIER[k],
                     "sim_tok_s": round(sim, 1),
                     "sim_over_real": round(sim / meas, 3) if meas else None,
                     "within_10pct": bool(meas) and abs(sim / meas - 1) <= TOLERANCE,
                     "sim_median_running": fixed[k].median_running, "sim_retractions": fixed[k].retractions,
                     "real_median_running": (real.running or {}).get(k)})
    best_real = max(real.fixed_tok_s, key=real.fixed_tok_s.get)
    best_sim = max(fixed, key=lambda k: fixed[k].gen_tok_s)
    adaptive_real = statistics.median(real.adaptive_tok_s) if real.adaptive_tok_s else None
    return {"source": real.source, "rows": rows, "best_real": best_real, "best_sim": best_sim,
            "same_best": best_real == best_sim, "all_within_10pct": all(r["within_10pct"] for r in rows),
            "adaptive_real_median": adaptive_real, "adaptive_sim": round(ours.gen_tok_s, 1),
            "adaptive_sim_over_real": round(ours.gen_tok_s / adaptive_real, 3) if adaptive_real else None,
            "adaptive_over_best_fixed_real": (round(adaptive_real / real.fixed_tok_s[best_real], 3)
                                              if adaptive_real else None),
            "adaptive_over_best_fixed_sim": round(ours.gen_tok_s / fixed[best_sim].gen_tok_s, 3),
            "kv_tokens": real.kv_tokens, "samples": len(real.lengths)}


def markdown(c: dict, profile: HardwareProfile, wall_s: float) -> str:
    table = md_table(["window", "real tok/s (mean)", "this run", "first run", "sim tok/s", "sim / real", "within 10 %",
                      "running real / sim (median)", "sim retractions"],
                     [[r["window"], f"{r['real_tok_s']:,.0f}", f"{r['this_run_tok_s']:,.0f}",
                       f"{r['earlier_tok_s']:,.0f}", f"{r['sim_tok_s']:,.0f}",
                       r["sim_over_real"], "yes" if r["within_10pct"] else "NO",
                       f"{r['real_median_running']} / {r['sim_median_running']}",
                       r["sim_retractions"]] for r in c["rows"]])
    ad = (f"| adaptive (median) | {c['adaptive_real_median']:,.0f} | {c['adaptive_this_run_median']:,.0f} | "
          f"{statistics.median(EARLIER_ADAPTIVE):,.0f} | {c['adaptive_sim']:,.0f} | "
          f"{c['adaptive_sim_over_real']} | | | |"
          ) if c["adaptive_real_median"] else ""
    return ("## Simulator vs the real H200 run (`python -m bench sim_vs_real`)\n\n"
            f"Real: {c['source']}; {c['samples']:,} samples replayed with their real prompt/output lengths, "
            f"{c['kv_tokens']:,} KV tokens, hardware profile \"h200\" (step {profile.step_base_s * 1e3:.2f} ms "
            f"+ {profile.decode_per_req_s * 1e6:.1f} us/request + {profile.decode_per_kv_token_s * 1e9:.2f} ns/KV "
            f"token + {profile.prefill_per_token_s * 1e6:.1f} us/prefill token). Best window real {c['best_real']}, "
            f"sim {c['best_sim']} ({'same' if c['same_best'] else 'DIFFERENT'}); all windows within 10 %: "
            f"{'yes' if c['all_within_10pct'] else 'NO'}. Adaptive / best fixed: real "
            f"{c['adaptive_over_best_fixed_real']}, sim {c['adaptive_over_best_fixed_sim']}. Wall {wall_s:.0f} s.\n\n"
            + table + ("\n" + ad if ad else "") + "\n\n" + NOTE)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.sim_vs_real", description=__doc__.splitlines()[0])
    p.add_argument("--fit", action="store_true",
                   help="print coefficients fitted to the real sweep, then compare with them")
    p.add_argument("--results", type=Path, default=REAL_RESULTS)
    p.add_argument("--regime", choices=("short", "long", "both"), default="both")
    p.add_argument("--traces", type=Path, default=None,
                   help="the GPU check's traces for the long regime (phase `regimes`; default "
                        "bench/gpu/h200_traces.json, or issue 19's figures without it)")
    args = p.parse_args(argv)
    if args.regime in ("long", "both"):
        if args.traces is not None and not args.traces.is_file():
            p.error(f"--traces {args.traces}: no such file; give a traces file the GPU check wrote "
                    "(bench/gpu/h200_traces*.json)")
        try:
            readable = args.traces is None or sim_vs_real_long.load_real(args.traces) is not None
        except (ValueError, KeyError, TypeError) as e:
            p.error(f"--traces {args.traces}: not a traces file the GPU check wrote ({e})")
        if not readable:
            p.error(f"--traces {args.traces}: no long-regime runs in it (the GPU check's phase `regimes` "
                    "writes them under \"long\")")
        long_started = time.monotonic()
        c_long = sim_vs_real_long.compare(args.traces or sim_vs_real_long.REAL_TRACES)
        text_long = sim_vs_real_long.markdown(c_long) + f" Wall {time.monotonic() - long_started:.0f} s."
        print(text_long)
        write_section("sim_vs_real_long", c_long, text_long)
        if args.regime == "long":
            return c_long
    started = time.monotonic()
    measured = load_real(args.results)
    real = mean_real(measured)
    profile = get_profile("h200")
    if args.fit:
        profile, info = fit(real, profile)
        print(f"fitted h200: step_base_s={profile.step_base_s:.6g}, decode_per_req_s={profile.decode_per_req_s:.6g}, "
              f"decode_per_kv_token_s={profile.decode_per_kv_token_s:.6g}, "
              f"prefill_per_token_s={profile.prefill_per_token_s:.6g} ({info})")
    fixed, ours = simulate(real, profile)
    c = compare(real, fixed, ours, measured.fixed_tok_s)
    c["adaptive_this_run_median"] = statistics.median(measured.adaptive_tok_s) if measured.adaptive_tok_s else None
    text = markdown(c, profile, time.monotonic() - started)
    print(text)
    if not args.fit:
        write_section("sim_vs_real", c, text)
    return c


if __name__ == "__main__":
    main()
