"""`diagnose`: what bounds a run, from its telemetry rows (pure; only `diagnose_dataset` reads files). Each
verdict is a named rule over the steady polls, thresholds in THRESHOLDS (docs/status.md tells users, calibration:
docs/measurements.md). Whether more slots pay is the elasticity: the least-squares slope of ln(gen tok/s) on
ln(running) after the warm-up, with one-sided Student's t bounds; a full pool alone says nothing (short outputs
fill it and are bound by the step time)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gen_pipeline.errors import ConfigError
from gen_pipeline.server.plan import GIB, KV_BYTES, REFERENCE_GPU_MEM_GIB, kv_bytes_per_token
from gen_pipeline.store.telemetry import read_telemetry, runs_of

THRESHOLDS: dict[str, float] = {
    "warmup_frac": 0.2,  # first share of a run's polls: the first wave, not the steady state
    "min_polls": 5,  # fewer steady polls than this: no verdict
    "kv_full": 0.90,  # no elasticity read, p90 KV usage at or above: kv_or_step (short outputs fill the pool too)
    "kv_free": 0.70,  # median KV usage below: the pool has room (and no elasticity says KV binds)
    # more slots pay at this elasticity: between KV-bound long outputs and step-bound short ones (docs/measurements.md)
    "elastic_min": 0.25,
    "elastic_confidence": 0.95,  # kv_bound: the lower bound at or above elastic_min; step_bound: the upper below
    "elastic_spread": 1.25,  # running must span this ratio (max / min over the polls used) to read it
    "elastic_floor": 0.25,  # polls with running below this share of the steady median are left out
    "queued_share": 0.5,  # share of steady polls with requests queued at the server
    "slots_low": 0.5, "slots_high": 2.5,  # running / (KV tokens / tokens per request): "≈"
    "at_cap": 0.95,  # running / max_running_requests at or above: at the cap
    "client_fill": 0.8,  # mean in_flight / window below: the window is not kept full
    "client_cpu": 0.85,  # the generate process's cores (steady median) at or above: busy (one event loop: one core)
    # a launched SGLang's main process (HTTP server + tokenizer manager, one event loop) at or above: it binds.
    # Its scheduler's core says nothing: it spins while it waits on the GPU (1.01 cores in every device run)
    "front_end_cpu": 0.9,
    "storm_per_completion": 0.25,  # retractions per completed sample at or above: a storm
    "storm_min": 10,  # ... and at least this many retractions
    "tail_level": 0.5,  # in flight below this share of the steady median: the tail
    "tail_frac": 0.15,  # the tail's share of the run's time at or above: an idle tail
    # graph_ceiling: this share of the polls above cuda_graph_max_bs, their rate per request graph_drop lower
    "graph_over_share": 0.25, "graph_drop": 0.15,
}
FP8 = "fp8_e4m3"


@dataclass(frozen=True)
class Verdict:
    rule: str
    title: str
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        return [f"{self.rule}: {self.title}"] + [f"  {x}" for x in self.evidence] + [f"  → {x}" for x in self.advice]


@dataclass(frozen=True)
class Hardware:
    """What `plan` needs to price the memory-fraction lever: the model's config.json and GPU memory."""

    model_config: dict[str, Any] | None = None
    gpu_mem_gb: float = REFERENCE_GPU_MEM_GIB
    tp_size: int = 8
    label: str = ""


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _vals(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _last(rows: list[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in reversed(rows) if r.get(key) is not None), None)


@dataclass(frozen=True)
class RunView:
    """One run's rows split into steady polls and the idle tail."""

    rows: list[dict[str, Any]]
    steady: list[dict[str, Any]]
    tail: list[dict[str, Any]]

    @property
    def after_warmup(self) -> list[dict[str, Any]]:
        """The steady polls and the tail: what the elasticity is read on."""
        return self.steady + self.tail

    @property
    def duration_s(self) -> float:
        return self.rows[-1]["t_run_s"] - self.rows[0]["t_run_s"] if len(self.rows) > 1 else 0.0


def view(rows: list[dict[str, Any]], th: dict[str, float] = THRESHOLDS) -> RunView:
    """Cut the warm-up and the tail (from the last poll where in flight was at its steady level)."""
    warm = int(len(rows) * th["warmup_frac"])
    level = _med(_vals(rows[warm:], "in_flight")) or 0
    busy = [i + 1 for i, r in enumerate(rows) if (r.get("in_flight") or 0) >= th["tail_level"] * level]
    end = busy[-1] if busy else len(rows)
    return RunView(rows, rows[min(warm, end):end], rows[end:])


def diagnose(all_rows: list[dict[str, Any]], hw: Hardware = Hardware(),
             th: dict[str, float] = THRESHOLDS) -> list[Verdict]:
    """Verdicts for the last run of `all_rows` (telemetry rows, oldest first) plus restarts of any run."""
    runs = runs_of(all_rows)
    out = [v for v in [_restarts(runs)] if v]
    if not runs:
        return out
    v = view(runs[-1], th)
    if len(v.steady) < th["min_polls"]:
        return out + [Verdict("too_short", f"run {runs[-1][0].get('run')} has {len(v.steady)} steady polls "
                              f"(< {th['min_polls']:.0f}): let it run longer")]
    for rule in (_graph_ceiling, _slots_bound, _free_pool, _client_bound, _front_end_bound, _retraction_storm,
                 _idle_tail):
        verdict = rule(v, hw, th)
        # a reservation-held pool reads below kv_free: KV or the step time already named the bound; past the
        # graph ceiling a bigger batch is the cost, so the slot rules' "more slots" reading does not apply
        named = {o.rule for o in out}
        if verdict and not (verdict.rule in ("compute_bound", *SLOT_RULES) and named & {"graph_ceiling", *SLOT_RULES}):
            out.append(verdict)
    return out


def _restarts(runs: list[list[dict[str, Any]]]) -> Verdict | None:
    hit = [(r[0].get("run"), n) for r in runs if (n := max(_vals(r, "restarts") or [0]))]
    if not hit:
        return None
    where = ", ".join(f"run {run}: {n:.0f}" for run, n in hit)
    return Verdict("server_restarts", f"the server restarted {sum(n for _, n in hit):.0f} time(s) ({where})",
                   advice=("read server.log in the dataset folder (gen_pipeline's server diagnosis names known "
                           "fatal lines: OOM, NCCL, CUDA); work in flight at a restart is sent again",))


def _levels(v: RunView) -> dict[str, Any]:
    s, usage = v.steady, _vals(v.steady, "kv_usage")
    p90 = statistics.quantiles(usage, n=10, method="inclusive")[8] if len(usage) > 1 else _med(usage)
    return {"usage": _med(usage), "usage_p90": p90, "running": _med(_vals(s, "running")),
            "queued": _med(_vals(s, "queued")), "tok_s": _med(_vals(s, "gen_tok_s") or _vals(s, "client_tok_s")),
            "queued_share": sum(1 for r in s if (r.get("queued") or 0) > 0) / len(s),
            "capacity": _last(s, "kv_capacity_tokens"), "max_running": _last(s, "max_running_requests"),
            "per_request": _last(s, "tokens_per_request"), "dtype": _last(s, "kv_dtype") or "auto"}


@dataclass(frozen=True)
class Elasticity:
    """d ln(gen tok/s) / d ln(running): `slope`, its one-sided elastic_confidence bounds `low` and `high`,
    over `polls` polls whose running spans `spread` (max / min)."""

    slope: float
    low: float
    high: float
    polls: int
    spread: float

    def text(self, th: dict[str, float]) -> str:
        return (f"the decode rate grows {self.slope:.2f}x as fast as running (one-sided {th['elastic_confidence']:.0%} "
                f"bounds {self.low:.2f} to {self.high:.2f} over {self.polls} polls after the warm-up, running "
                f"spanning {self.spread:.2f}x)")


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (Cornish-Fisher expansion, Abramowitz & Stegun 26.7.5)."""
    z = statistics.NormalDist().inv_cdf(p)
    terms = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(g / float(df) ** (k + 1) for k, g in enumerate(terms))


def _read_elasticity(rows: list[dict[str, Any]], th: dict[str, float]) -> Elasticity | str:
    """The slope of ln(gen tok/s) on ln(running) with its confidence bounds, or why it cannot be read; over the
    polls with a decode rate and running at or above elastic_floor."""
    floor = max(1.0, th["elastic_floor"] * (_med(_vals(rows, "running")) or 0))
    pts = [(math.log(r["running"]), math.log(r["gen_tok_s"])) for r in rows
           if (r.get("running") or 0) >= floor and (r.get("gen_tok_s") or 0) > 0]
    if len(pts) < max(th["min_polls"], 3):
        return (f"only {len(pts)} polls after the warm-up report a decode rate with running near its level: too few "
                "to read how the decode rate grows with running")
    xs = [x for x, _ in pts]
    if max(xs) - min(xs) < math.log(th["elastic_spread"]) - 1e-9:  # 160 / 128 spans 1.25x
        lo, hi = math.exp(min(xs)), math.exp(max(xs))
        return (f"running stayed within {lo:.0f}-{hi:.0f} ({hi / lo:.2f}x, under the {th['elastic_spread']:.2f}x "
                f"needed) over {len(pts)} polls after the warm-up: too little to read how the decode rate grows "
                "with it")
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
    margin = t_quantile(th["elastic_confidence"], len(pts) - 2) * math.sqrt(residual / (len(pts) - 2) / sxx)
    return Elasticity(slope, slope - margin, slope + margin, len(pts), math.exp(max(xs) - min(xs)))


def elasticity(rows: list[dict[str, Any]], th: dict[str, float] = THRESHOLDS) -> Elasticity | None:
    """The elasticity over `rows` (the polls after the warm-up); None when it cannot be read."""
    return e if isinstance(e := _read_elasticity(rows, th), Elasticity) else None


def _graph_ceiling(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    """graph_ceiling: running past the server's cuda_graph_max_bs with the per-request decode rate falling
    there (or nothing below it to compare with)."""
    rows = [r for r in v.after_warmup if (r.get("running") or 0) > 0 and (r.get("gen_tok_s") or 0) > 0]
    ceiling = _last(v.rows, "cuda_graph_max_bs")
    if not ceiling:  # a falling rate alone is no ceiling: the short regime's gauge swings with prefills
        return None
    above = [r for r in rows if r["running"] > ceiling]
    below = [r for r in rows if r["running"] <= ceiling]
    if len(above) < max(th["min_polls"], th["graph_over_share"] * len(rows)):
        return None
    per_above = statistics.median(r["gen_tok_s"] / r["running"] for r in above)
    crossed = (f"{statistics.median(r['running'] for r in above):.0f} running (median) in {len(above)} of {len(rows)} "
               f"polls after the warm-up, above cuda_graph_max_bs {ceiling}: each decode step of more than {ceiling} "
               "requests runs without a CUDA graph")
    if len(below) >= 3:
        per_below = statistics.median(r["gen_tok_s"] / r["running"] for r in below)
        if per_above > (1 - th["graph_drop"]) * per_below:
            return None  # crossed, but the rate per request held: no slower step to name
        measured = (f"decode rate per running request {per_below:,.1f} tok/s at or below {ceiling} running "
                    f"({len(below)} polls), {per_above:,.1f} above: {per_above / per_below:.2f}x; generation "
                    f"{statistics.median(r['gen_tok_s'] for r in below):,.0f} tok/s below against "
                    f"{statistics.median(r['gen_tok_s'] for r in above):,.0f} above (medians)")
        title = f"running crossed SGLang's CUDA-graph ceiling ({ceiling}) and the decode slowed past it"
    else:
        measured = (f"decode rate per running request {per_above:,.1f} tok/s above it (generation "
                    f"{statistics.median(r['gen_tok_s'] for r in above):,.0f} tok/s, median); no polls at or below "
                    f"it to compare with: past the ceiling a decode step takes about twice as long "
                    '(docs/measurements.md, "The CUDA-graph ceiling")')
        title = f"running stayed above SGLang's CUDA-graph ceiling ({ceiling}): its decode steps ran without a graph"
    return Verdict(
        "graph_ceiling", title, (crossed, measured),
        (f"keep the batch at or below {ceiling}: --window {ceiling} or fewer (the adaptive controller holds requests "
         "in flight at the ceiling when the server reports cuda_graph_max_bs in /server_info)",
         f'or raise the ceiling in the server profile: extra_args = ["--cuda-graph-max-bs", "{2 * ceiling}"] '
         "(SGLang captures decode graphs up to that batch: more GPU memory for them, a longer start-up)"))


SLOT_RULES = ("kv_bound", "step_bound", "kv_or_step")


def _slots_bound(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    """Where the slots are held (requests queued in most steady polls, running below max_running_requests and
    ≈ KV tokens / tokens per request): kv_bound, step_bound or kv_or_step by the elasticity's bounds."""
    x = _levels(v)
    running, cap, per_req, usage, usage_p90 = x["running"], x["capacity"], x["per_request"], x["usage"], x["usage_p90"]
    if running is None or not cap or not per_req or x["queued_share"] < th["queued_share"]:
        return None
    slots = cap / per_req
    if (x["max_running"] and running >= th["at_cap"] * x["max_running"]) \
            or not th["slots_low"] <= running / slots <= th["slots_high"]:
        return None
    read = _read_elasticity(v.after_warmup, th)  # or why it cannot be read
    e = read if isinstance(read, Elasticity) else None
    if e is None and (usage_p90 is None or usage_p90 < th["kv_full"]):
        return None  # running never moved and the pool does not fill: nothing says KV holds the slots
    held = (f"{running:.0f} running ≈ {cap:,} KV tokens / {per_req:,.0f} tokens per request = {slots:.0f} "
            f"slots, {x['queued']:,.0f} queued at the server (requests waiting in {x['queued_share']:.0%} of "
            f"{len(v.steady)} steady polls)")
    used = (f"KV {usage:.0%} in use (median; 90th percentile {usage_p90:.0%}), the rest held by SGLang's admission "
            "reservation (new_token_ratio × min(max_new_tokens, 4096) per running request)"
            if usage is not None else "KV usage not reported")
    tok_s = f"; generation {x['tok_s']:,.0f} tok/s" if x["tok_s"] is not None else ""
    if e is not None and e.low >= th["elastic_min"]:
        return Verdict("kv_bound", "GPU KV capacity bounds the decode slots",
                       (f"{held}; {used}", f"{e.text(th)}: more slots pay{tok_s}"),
                       tuple(kv_levers(cap, x["dtype"], per_req, running, x["queued"] or 0, hw)))
    if e is not None and e.high < th["elastic_min"]:
        return Verdict("step_bound", "the GPU's step time, not KV, bounds the run",
                       (f"{running:.0f} running with {x['queued']:.0f} queued, but {e.text(th)}: 10% more running "
                        f"gives at most {100 * (1.1 ** max(e.high, 0) - 1):.0f}% more tokens/s",),
                       ("more KV (fp8, mem fraction) or a larger window adds little here; more servers add "
                        "throughput",))
    why = (f"{e.text(th)}: running moved too little against the decode rate's noise to say whether it grows at "
           f"least {th['elastic_min']:.2f}x as fast" if e is not None else str(read))
    drop = 1 - 0.5 ** th["elastic_min"]
    return Verdict("kv_or_step", "KV holds the decode slots; whether more slots would pay cannot be read from this run",
                   (f"{held}; {used}", why + tok_s),
                   (f"run once with --window {max(1, round(running / 2))} (half the running): if tokens/s falls by "
                    f"{drop:.0%} or more, KV bounds the run (fp8 KV, mem fraction: more slots pay); if by less, the "
                    "step time does (more servers add throughput, more KV does not)",))


def kv_levers(capacity: int, kv_dtype: str, per_request: float, running: float, queued: float,
              hw: Hardware = Hardware()) -> list[str]:
    """The three levers priced with plan's arithmetic: KV dtype, memory fraction, hicache."""
    out, want = [], running + queued
    if (cur := KV_BYTES.get(kv_dtype, 2)) > KV_BYTES[FP8]:
        factor = cur // KV_BYTES[FP8]
        tokens = capacity * factor
        # the pool holds `running` requests of every age now: factor x the pool holds factor x as many
        new_running = min(running * factor, want)
        out.append(f"--kv-cache-dtype {FP8}: {factor}x the KV tokens ({capacity:,} → {tokens:,}, "
                   f"{tokens / per_request:.0f} requests at their end) → ~{new_running:.0f} running of the "
                   f"{want:.0f} wanting a slot: {new_running / max(running, 1):.1f}x decode slots (tok/s rises less: "
                   "a bigger batch steps slower)")
    if hw.model_config is not None:
        per_token = kv_bytes_per_token(hw.model_config, kv_dtype if kv_dtype in KV_BYTES else "bf16", hw.tp_size)[2]
        extra = int(hw.gpu_mem_gb * 0.01 * GIB // per_token)
        out.append(f"--mem-fraction-static +0.01: +{extra:,} KV tokens (+{extra / per_request:.0f} slots; plan with "
                   f"{hw.label or 'the model config'}, {hw.gpu_mem_gb:g} GiB/GPU); keep ~3.5 GB/GPU free")
    out.append("hierarchical cache (--enable-hierarchical-cache): adds no decode slots; running requests live "
               "in GPU KV, hicache only keeps evicted prefixes")
    return out


def _free_pool(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    x = _levels(v)
    usage, running, cap_r = x["usage"], x["running"], x["max_running"]
    if usage is None or running is None or usage >= th["kv_free"] or x["queued_share"] < th["queued_share"]:
        return None
    evidence = (f"KV pool only {usage:.0%} used, {x['queued']:.0f} queued at the server, {running:.0f} running"
                + (f" of max_running_requests {cap_r}" if cap_r else ""),)
    if cap_r and running >= th["at_cap"] * cap_r:
        room = x["capacity"] * (1 - usage) / x["per_request"] if x["capacity"] and x["per_request"] else None
        return Verdict("admission_bound", f"max_running_requests ({cap_r}) bounds the decode slots, not KV", evidence,
                       (f"raise --max-running-requests (the free KV holds ~{room:.0f} more requests)" if room
                        else "raise --max-running-requests",))
    return Verdict("compute_bound", "the scheduler holds requests back with KV free and below max_running_requests",
                   evidence, ("SGLang admits on a reservation of new_token_ratio × min(max_new_tokens, 4096) per "
                              "request: a max_new_tokens far above the real outputs holds KV back (lower it, or "
                              "--schedule-conservativeness < 1); else the prefill budget (--max-prefill-tokens) or "
                              "compute is the limit: add servers; a larger window only lengthens the queue",))


def _client_bound(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    s = [r for r in v.steady if r.get("window")]
    if not s:
        return None
    fill = statistics.fmean(min(1.0, (r.get("in_flight") or 0) / r["window"]) for r in s)
    queued_share = sum(1 for r in s if (r.get("queued") or 0) > 0) / len(s)
    cpu = _med(_vals(s, "client_cpu"))
    running, window = _med(_vals(s, "running")), _med(_vals(s, "window")) or 0
    # the server has free slots: what runs there stays below the window and nothing waits in its queue
    slots_free = queued_share < th["queued_share"] and (
        fill < th["client_fill"] or (running is not None and running < th["client_fill"] * window))
    if cpu is not None and cpu >= th["client_cpu"] and slots_free:
        return Verdict("client_bound", "the client's own CPU bounds the run",
                       (f"the generate process used {cpu:.2f} of a core (median of {len(s)} steady polls)"
                        + (f" while the server ran {running:.0f} requests" if running is not None else "")
                        + f" of a window of {window:.0f} (in flight {fill:.0%} of it on average) and queued "
                        f"requests in {queued_share:.0%} of polls",),
                       ("read the answers in reader processes: --readers N (without the flag one is added each "
                        "time the main process used half a core over 2 s, up to half the cores; --readers 0 turns "
                        "them off)",
                        "each streamed chunk costs the client CPU: raise SGLang's --stream-interval (e.g. 8, the "
                        "shipped profiles' stream_interval; a loop is then aborted at most 7 tokens later) or set "
                        '[generation] on_loop = "off" (turns sent whole, no loop gate)',))
    if fill >= th["client_fill"] or queued_share >= th["queued_share"]:
        return None
    return Verdict("client_bound", "the client keeps fewer requests in flight than the window allows",
                   (f"in flight {fill:.0%} of the window on average (median {_med(_vals(s, 'in_flight')):.0f} of "
                    f"{_med(_vals(s, 'window')):.0f}), the server queued requests in {queued_share:.0%} of polls"
                    + (f"; the generate process used {cpu:.2f} of a core" if cpu is not None else ""),),
                   ("the source or the client is the limit, not the server: a slow or mostly-rejected source "
                    "(see rejects.jsonl), streaming from the hub, or a CPU-starved client process",))


def _front_end_bound(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    cpu = _med(_vals(v.steady, "front_end_cpu"))
    if cpu is None or cpu < th["front_end_cpu"]:
        return None
    running, gen = _med(_vals(v.steady, "running")), _med(_vals(v.steady, "gen_tok_s"))
    return Verdict("front_end_bound", "SGLang's HTTP front end uses a whole core: it, not the GPU, bounds the run",
                   (f"SGLang's busiest front-end process (its HTTP server and tokenizer manager: the main process or "
                    f"one of its tokenizer workers, an event loop each) used {cpu:.2f} of a core (median of "
                    f"{len(v.steady)} steady polls)"
                    + (f" while the server ran {running:.0f} requests" if running is not None else "")
                    + (f" at {gen:,.0f} tok/s" if gen is not None else ""),),
                   ("every streamed chunk costs it CPU: raise SGLang's --stream-interval (the profile's "
                    "stream_interval; 8 in the shipped profiles, SGLang's default is 1): a chunk every 8 tokens "
                    "instead of every token",
                    "SGLang 0.5.17 can run its front end in several processes: --tokenizer-worker-num 4 (or more "
                    "than the profile has) in its extra_args, which made a small model's run at interval 1 1.5 x "
                    "as fast on one H100; or split the GPUs into more servers, each with its own",))


def _retraction_storm(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    retracted = _last(v.rows, "retractions") or 0
    done = _vals(v.rows, "done")
    completions = (done[-1] - done[0]) if len(done) > 1 else 0
    if retracted < max(th["storm_min"], th["storm_per_completion"] * completions):
        return None
    return Verdict("retraction_storm", f"{retracted:,} retractions for {completions:,} completed samples",
                   (f"{100 * retracted / max(completions, 1):.0f} retractions per 100 samples; each one frees a "
                    "request's KV and recomputes it later (a stall of seconds)",),
                   ("too many requests for the pool: let the controller size the window (drop --window) or "
                    f"lower it; more KV ({FP8}, mem fraction) also makes room",))


def _idle_tail(v: RunView, hw: Hardware, th: dict[str, float]) -> Verdict | None:
    if not v.tail or v.duration_s <= 0:
        return None
    tail_s = v.rows[-1]["t_run_s"] - v.tail[0]["t_run_s"]
    if tail_s < th["tail_frac"] * v.duration_s:
        return None
    return Verdict("idle_tail", f"the last {tail_s:.0f} s ({tail_s / v.duration_s:.0%} of the run) ran below "
                   f"{th['tail_level']:.0%} of the steady {_med(_vals(v.steady, 'in_flight')) or 0:.0f} in flight",
                   ("the last, longest requests finish alone while the server idles",),
                   ("run the datasets as one job so the next dataset fills the tail, or cap max_new_tokens",))


def format_diagnosis(dataset: str, rows: list[dict[str, Any]], verdicts: list[Verdict]) -> str:
    """A few lines for a terminal: which run, then each verdict with its numbers and levers."""
    if not rows:
        return f"{dataset}: no telemetry yet (telemetry.jsonl is written by generate; run it first)."
    last, runs = rows[-1], len({r.get("run") for r in rows})
    head = f"{dataset}: run {last.get('run')} ({len(rows)} polls over {runs} run(s); mode {last.get('mode')})"
    if not verdicts:
        verdicts = [Verdict("balanced", "no bottleneck rule fired: neither KV, admission, client, the server's "
                                        "front end nor retractions bound this run")]
    return "\n".join([head] + [line for v in verdicts for line in v.lines()])


@dataclass(frozen=True)
class DatasetDiagnosis:
    """A dataset folder's telemetry and what it says (`text`: format_diagnosis's)."""

    folder: Path
    rows: list[dict[str, Any]]
    text: str


def diagnose_dataset(output_root: Path, dataset: str, *, model_config: Path, gpu_mem_gb: float,
                     tp_size: int) -> DatasetDiagnosis:
    """Read outputs/<dataset>/telemetry.jsonl and diagnose it, pricing the memory lever with
    `model_config` (a config.json) on `tp_size` GPUs of `gpu_mem_gb` GiB. ConfigError names the
    missing folder or the unreadable --model-config."""
    folder = output_root / dataset
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such output folder. Generate it first (make generate DATASET={dataset}).")
    rows = read_telemetry(folder)
    try:
        model_cfg = json.loads(model_config.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model-config {model_config}: cannot read it as JSON ({e}).") from None
    hw = Hardware(model_cfg, gpu_mem_gb, tp_size, label=model_config.name)
    return DatasetDiagnosis(folder, rows, format_diagnosis(dataset, rows, diagnose(rows, hw) if rows else []))
