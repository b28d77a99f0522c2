"""Per-second server traces of one run and what is read from them (issue 19).

A trace row: t_s (seconds since the client had its server), running / queued / token_usage /
used_tokens from /v1/loads (live, as the controller reads them), new_token_ratio / gen_throughput /
the retraction and generation counters from /metrics. The GPU check records them on real SGLang
(`TracePoller`, bench/gpu/h200_check.py phase `regimes`); the simulator's runs give the same rows
(bench/jobs.py trace_point); `summarize` reads both the same way, so `python -m bench sim_vs_real`
compares like with like.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gen_pipeline.server.load import load_from_loads, metric_values

# The committed traces of phase `regimes` (one file per H200 run), the newest full run first: run 4 (both
# regimes), run 5 (long outputs, 900 prompts), run 3, run 2.
COMMITTED = tuple(Path(__file__).resolve().parent / f"h200_traces{s}.json" for s in ("", "_run5", "_run3", "_run2"))
RATIO_WARM = 0.15  # new_token_ratio at or below this: SGLang's admission has warmed up (floor 0.098)
STEADY_FROM = 0.2  # the steady state starts at this share of the run (and after the ramp) ...
RAMP_SHARE = 0.9  # ... the ramp ends when running first reaches this share of the steady median


class TracePoller:
    """Polls /v1/loads and /metrics once a second in a thread; `stop(t0)` returns the rows."""

    def __init__(self, url: str, interval_s: float = 1.0):
        self.url, self.interval_s, self.rows = url, interval_s, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        with httpx.Client(timeout=5.0) as http:
            while not self._stop.is_set():
                now = time.monotonic()
                with contextlib.suppress(httpx.HTTPError, ValueError):  # a missed poll is a gap
                    self.rows.append(row_of(now, http.get(self.url + "/v1/loads").json(),
                                            http.get(self.url + "/metrics").text))
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - now)))

    def stop(self, t0: float) -> list[dict]:
        """The rows with t_s measured from `t0` (monotonic seconds), none before it."""
        self._stop.set()
        self._t.join(timeout=10)
        return [{**r, "t_s": round(r["t_s"] - t0, 2)} for r in self.rows if r["t_s"] >= t0]


def row_of(now: float, loads: Any, metrics_text: str) -> dict:
    snap = load_from_loads(loads, now)
    values = metric_values(metrics_text)

    def one(name: str) -> float | None:
        v = values.get(name)
        return round(sum(v.values()), 4) if v else None

    ratio = values.get("sglang:new_token_ratio")
    return {"t_s": now, "running": snap.running if snap else one("sglang:num_running_reqs"),
            "queued": snap.queued if snap else one("sglang:num_queue_reqs"),
            "token_usage": round(snap.token_usage, 4) if snap and snap.token_usage is not None
            else one("sglang:token_usage"),
            "used_tokens": snap.used_tokens if snap else None,
            "new_token_ratio": round(max(ratio.values()), 4) if ratio else None,
            "gen_throughput": one("sglang:gen_throughput"),
            "retractions_total": one("sglang:num_retracted_requests_total") or 0,
            "gen_tokens_total": one("sglang:generation_tokens_total")}


def steady_span(trace: list[dict]) -> tuple[float, float]:
    """(start, end) seconds of the steady state: from STEADY_FROM of the run (and the end of the ramp)
    to the last poll with requests queued at the server (after it the run drains)."""
    if not trace:
        return 0.0, 0.0
    end_t = trace[-1]["t_s"]
    queued = [r["t_s"] for r in trace if (r["queued"] or 0) > 0]
    last_queued = queued[-1] if queued else end_t
    start = STEADY_FROM * end_t
    middle = [r["running"] for r in trace if start <= r["t_s"] <= last_queued]
    if middle:
        ramp = ramp_s(trace, statistics.median(middle))
        start = max(start, ramp if ramp is not None else start)
    return start, max(start, last_queued)


def ramp_s(trace: list[dict], steady_running: float) -> float | None:
    """Seconds until running first reaches RAMP_SHARE of `steady_running`."""
    return next((r["t_s"] for r in trace if r["running"] >= RAMP_SHARE * steady_running), None)


def summarize(trace: list[dict]) -> dict:
    """What a run's trace shows: the first admission round, the ramp, the steady state, the whole run."""
    if not trace:
        return {}
    t0, t1 = steady_span(trace)
    steady = [r for r in trace if t0 <= r["t_s"] <= t1] or trace
    run_median = statistics.median(r["running"] for r in steady)
    usage = [r["token_usage"] for r in trace if r["token_usage"] is not None]
    ratios = [r for r in trace if r.get("new_token_ratio") is not None]
    first = next((r for r in trace if r["running"] > 0), None)
    gen = [r["gen_throughput"] for r in steady if r.get("gen_throughput") is not None]
    counter = [(r["t_s"], r["gen_tokens_total"]) for r in steady if r.get("gen_tokens_total") is not None]
    retr = [r["retractions_total"] or 0 for r in trace]
    return {
        "first_round": {"t_s": first["t_s"], "running": first["running"]} if first else None,
        "ramp_s": ramp_s(trace, run_median),
        "ratio_warm_s": next((r["t_s"] for r in ratios if r["new_token_ratio"] <= RATIO_WARM), None),
        "steady_s": [round(t0, 1), round(t1, 1)],
        "steady_running_mean": _r(statistics.fmean(r["running"] for r in steady)),
        "steady_running_median": run_median,
        "steady_queued_mean": _r(statistics.fmean(r["queued"] for r in steady)),
        "steady_queued_max": max(r["queued"] for r in steady),
        "steady_usage_mean": _r(statistics.fmean(u for r in steady if (u := r["token_usage"]) is not None), 3)
        if any(r["token_usage"] is not None for r in steady) else None,
        "usage_mean": _r(statistics.fmean(usage), 3) if usage else None,
        "usage_p90": _r(_quantile(usage, 0.9), 3) if usage else None,
        "steady_gen_throughput_mean": _r(statistics.fmean(gen)) if gen else None,
        "steady_gen_counter_tok_s": _r((counter[-1][1] - counter[0][1]) / (counter[-1][0] - counter[0][0]))
        if len(counter) > 1 and counter[-1][0] > counter[0][0] else None,
        "retractions": max(retr) - min(retr) if retr else 0,
        "polls": len(trace),
    }


def decode_speed(trace: list[dict]) -> dict:
    """The server's decode step at two batch sizes, from its gen_throughput gauge (SGLang: decode tokens over
    the wall time of the last 40 decode iterations, prefill iterations included), read the same way from a real
    and a simulated trace: `first_*` over the first admission round (the polls from the first one with requests
    running until new_token_ratio reads warm: nothing finishes there, a pure decode batch), `steady_*` over the
    steady state (`summarize`'s span). Batch in requests, step in ms; None where the trace does not show it."""
    out: dict = {"first_batch": None, "first_step_ms": None, "steady_batch": None, "steady_step_ms": None}
    first: list[dict] = []
    for r in trace:
        if first or r["running"] > 0:
            ratio = r.get("new_token_ratio")
            if ratio is not None and ratio <= RATIO_WARM:
                break
            first.append(r)
    first = [r for r in first if r["running"] > 0 and (r.get("gen_throughput") or 0) > 0]
    if first:
        out["first_batch"] = statistics.median(r["running"] for r in first)
        out["first_step_ms"] = _r(statistics.median(1e3 * r["running"] / r["gen_throughput"] for r in first), 3)
    s = summarize(trace)
    if s.get("steady_gen_throughput_mean"):
        out["steady_batch"] = s["steady_running_mean"]
        out["steady_step_ms"] = _r(1e3 * s["steady_running_mean"] / s["steady_gen_throughput_mean"], 3)
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _r(x: float, digits: int = 1) -> float:
    return round(x, digits)


def telemetry_rows(trace: list[dict], *, kv_tokens: int, max_running: int | None, tokens_per_request: float,
                   window: int | None = None, samples: int | None = None) -> list[dict]:
    """A trace as the telemetry rows `gen-pipeline diagnose` reads (gen_pipeline/reports/diagnose.py), so
    its verdict can be checked on the simulator's and the H200's traces of a regime. Retractions are the
    run's own (SGLang's counter is the server's lifetime count: its first value in the trace is subtracted).
    A trace has no completion count: `done` climbs evenly to `samples` (the run's completions, where known;
    diagnose reads only its rise over the run), else it is the poll's index."""
    rows = []
    retracted_before = (trace[0].get("retractions_total") or 0) if trace else 0
    for i, r in enumerate(trace):
        in_flight = (r["running"] or 0) + (r["queued"] or 0)
        rows.append({"t_run_s": r["t_s"], "run": 1, "restarts": 0, "running": r["running"], "queued": r["queued"],
                     "in_flight": in_flight, "window": r.get("window") or window or in_flight,
                     "kv_usage": r["token_usage"], "kv_capacity_tokens": kv_tokens, "max_running_requests": max_running,
                     "tokens_per_request": tokens_per_request, "gen_tok_s": r.get("gen_throughput"),
                     "done": round(samples * i / max(len(trace) - 1, 1)) if samples is not None else i,
                     "retractions": (r.get("retractions_total") or 0) - retracted_before, "kv_dtype": "auto"})
    return rows
