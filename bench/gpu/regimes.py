"""Phase `regimes` of the GPU check (issue 19): the short- and long-output regimes on one server,
interleaved clients, three rounds, the server's figures recorded once a second.

Per round, per regime (their order alternates), per client (their order rotates): one attach-mode run
into a fresh folder, the prefix cache flushed first, /v1/loads and /metrics polled once a second from
the moment the CLI has its server (bench/gpu/traces.py). Clients: short outputs (max 512, 1,200
prompts, ~20 s): fixed 128 (the best window of issue 9's sweep), all at once, adaptive; long outputs
(max_new_tokens 4096 with min_tokens 1000, 300 prompts, ~45 s, SGLang's ~3 s start-up ramp under 10 %
of a run): fixed 40 (about the slot count), all at once, adaptive. A round takes ~230 s on the H200,
three ~11.5 min; `--budget-s` stops before a run that would not end in time (its expected length is
the same client's last run, else EXPECT_S), and the next call goes on where it stopped: runs
accumulate in results.json ("regimes") and, with their traces and the summary, in traces.json: the
file to commit as bench/gpu/h200_traces.json (`python -m bench sim_vs_real` and `python -m bench
gpu_h200` read it).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu import runs, servers
from bench.gpu.setup import (
    LONG_DATASET,
    LONG_PROMPTS,
    LONG_PROMPTS_MAX,
    PROFILE_KV_TOKENS,
    SHORT_DATASET,
    SHORT_PROMPTS,
)
from bench.gpu.traces import TracePoller, summarize
from gen_pipeline.reports.diagnose import diagnose
from gen_pipeline.store.telemetry import read_telemetry

ROUNDS = 3
MARGIN_S = 15.0  # CLI start, cache flush, results writing around a run


@dataclass(frozen=True)
class Regime:
    dataset: str
    prompts: int
    clients: dict[str, int | None]  # name -> fixed window (None: the controller)
    expect_s: float  # a run's wall time before one has been measured


ON_REQUEST = frozenset({"fixed-256"})  # run only when --clients names them


def _short_clients(prompts: int) -> dict[str, int | None]:
    # fixed-256: SGLang's CUDA-graph ceiling on one GPU, the best fixed window where the batch would cross it
    return {"fixed-128": 128, "fixed-256": 256, "all": prompts, "adaptive": None}


REGIMES = {
    "short": Regime(SHORT_DATASET, SHORT_PROMPTS, _short_clients(SHORT_PROMPTS), 50.0),
    "long": Regime(LONG_DATASET, LONG_PROMPTS, {"fixed-40": 40, "all": LONG_PROMPTS, "adaptive": None}, 45.0),
}


def plan(rounds: int = ROUNDS, order: tuple[str, ...] = ("short", "long"),
         clients: frozenset[str] | None = None) -> list[tuple[int, str, str]]:
    """(round, regime, client) in the order they run: regimes alternate, clients rotate; `clients`: only
    those (names as in REGIMES, e.g. "all", "adaptive")."""
    out = []
    for r in range(1, rounds + 1):
        for regime in (order if r % 2 else order[::-1]):
            names = [c for c in REGIMES[regime].clients
                     if (c in clients if clients is not None else c not in ON_REQUEST)]
            if not names:
                continue
            k = (r - 1) % len(names)
            out += [(r, regime, c) for c in names[k:] + names[:k]]
    return out


_READERS_CPU = re.compile(r"reader processes: (\d+) started; CPU while reading: main process ([\d.]+) s, readers "
                          r"([\d.]+) s")


def readers_cpu(run_log: Path) -> tuple[int, float, float] | None:
    """run.log's last line on reader processes (run/readers.py): how many started, and the CPU seconds of the
    main process and of the readers while reading; None without readers."""
    m = _READERS_CPU.search(run_log.read_text()) if run_log.exists() else None
    return (int(m[1]), float(m[2]), float(m[3])) if m else None


def readers_figures(run_log: Path, completion_tokens: int) -> dict:
    """readers_cpu per 1K completion tokens."""
    if (cpu := readers_cpu(run_log)) is None:
        return {"readers_started": 0}
    per_1k = 1e6 / max(completion_tokens, 1)
    return {"readers_started": cpu[0], "main_cpu_ms_per_1k_tokens": round(cpu[1] * per_1k, 2),
            "readers_cpu_ms_per_1k_tokens": round(cpu[2] * per_1k, 2)}


def configure(check: Any) -> None:
    """The prompts of a run of each regime, from the check's --short-prompts / --long-prompts."""
    short_prompts = getattr(check, "short_prompts", SHORT_PROMPTS)
    if short_prompts != SHORT_PROMPTS:
        REGIMES["short"] = Regime(SHORT_DATASET, short_prompts, _short_clients(short_prompts), 35.0)
    long_prompts = min(getattr(check, "long_prompts", LONG_PROMPTS), LONG_PROMPTS_MAX)
    if long_prompts != LONG_PROMPTS:  # a longer run: SGLang's start-up and the first cohort weigh less
        REGIMES["long"] = Regime(LONG_DATASET, long_prompts, {"fixed-40": 40, "all": long_prompts, "adaptive": None},
                                 45.0 * long_prompts / LONG_PROMPTS)


def run_phase(check: Any, rounds: int = ROUNDS) -> None:
    """Run what is missing of plan(rounds) while the budget lasts; then summarize."""
    order = tuple(getattr(check, "regimes_order", None) or ("short", "long"))
    configure(check)
    profile = getattr(check, "server_profile", "h200")
    server = check.ensure("main" if profile == "h200" else profile, profile)
    res = check.results.setdefault("regimes", {"runs": []})
    traces_path = check.work / "traces.json"
    traces = json.loads(traces_path.read_text()) if traces_path.exists() else {}
    done = {(r["round"], r["regime"], r["client"]) for r in res["runs"]}
    for rnd, regime, client in plan(rounds, order, getattr(check, "clients", None)):
        if (rnd, regime, client) in done:
            continue
        previous = [r["wall_s"] for r in res["runs"] if (r["regime"], r["client"]) == (regime, client)]
        expect = (previous[-1] if previous else REGIMES[regime].expect_s) + MARGIN_S
        if check.left_s() < expect:
            check.log(f"regimes: {check.left_s():.0f} s left, {regime}/{client} round {rnd} needs ~{expect:.0f} s: "
                      "stopping here (call the phase again to go on)")
            break
        row, trace, lengths = measure(check, server, rnd, regime, client)
        res["runs"].append(row)
        entry = traces.setdefault(regime, {"kv_tokens": PROFILE_KV_TOKENS[profile], "profile": profile, "runs": []})
        entry["runs"].append({**row, "trace": trace})
        if lengths and "lengths" not in entry:
            entry["lengths"] = lengths
        res["summary"] = traces["summary"] = summarize_regimes(res["runs"])
        traces["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        traces["sim"] = check.sim
        if "device" not in traces:  # once a file: nvidia-smi is a process
            traces["device"] = None if check.sim else servers.gpu_name()
        traces_path.write_text(json.dumps(traces) + "\n")
        check.save()


def measure(check: Any, server: servers.Server, rnd: int, regime: str, client: str, name: str | None = None,
            extra: tuple[str, ...] = ()) -> tuple[dict, list[dict], list[list[int]]]:
    """One run: its figures, its server trace and (prompt, completion) tokens per sample; `name`: its
    output folder and log (default REGIME-CLIENT-ROUND); `extra`: more flags for generate."""
    spec = REGIMES[regime]
    window = spec.clients[client]
    name = name or f"{regime}-{client}-{rnd}"
    out = check.out / name
    servers.flush_cache(server)
    poller = TracePoller(server.url)
    row_start = _log_size(server)
    args = ["--server-url", server.url, "--limit", str(spec.prompts), *extra]
    args += ["--window", str(window)] if window else []
    server_cpu = servers.group_cpu_s(server.pid)
    run = runs.run_cli(name, runs.cli_argv(check.cfg, out, *args, dataset=spec.dataset), check.logs)
    server_cpu = {k: v - server_cpu.get(k, 0.0) for k, v in servers.group_cpu_s(server.pid).items()}
    trace = poller.stop(run.ready_mono if run.ready_mono is not None else 0.0)
    figures = runs.read_outputs(out / spec.dataset)
    verdicts = diagnose(read_telemetry(out / spec.dataset))
    shape = summarize(trace)
    steady_tok_s = shape.get("steady_gen_throughput_mean")
    row = {"round": rnd, "regime": regime, "client": client, "rc": run.rc, "rows": figures["rows"],
           "duplicates": figures["duplicates"], "completion_tokens": figures["completion_tokens"],
           "prompt_tokens": figures["prompt_tokens"],
           "dispatch_s": round(run.dispatch_s, 2), "wall_s": round(run.wall_s, 1),
           "tok_s": round(figures["completion_tokens"] / max(run.dispatch_s, 1e-6), 1),
           "steady_tok_s": steady_tok_s, "client_cpu_s": round(run.cpu_s, 2),
           "client_cpu_ms_per_1k_tokens": round(1e6 * run.cpu_s / max(figures["completion_tokens"], 1), 2),
           "client_core_share": round(run.cpu_s / max(run.wall_s, 1e-6), 3),
           # the server's processes over the same run: a share near 1 is a Python process that binds
           "server_core_share": {k: round(v / max(run.wall_s, 1e-6), 3) for k, v in sorted(server_cpu.items())},
           "trace_summary": shape, "controller": run.controller_figures(),
           "diagnose": [v.rule for v in verdicts], "diagnose_text": [v.lines() for v in verdicts],
           "cuda_graph": _graph_share(server, row_start)}
    row.update(readers_figures(out / spec.dataset / "run.log", figures["completion_tokens"]))
    if figures["rows"] != spec.prompts:
        row["warning"] = f"{figures['rows']} rows, expected {spec.prompts}"
    check.log(f"{name}: {row['rows']} rows, {row['tok_s']:.0f} tok/s (steady {steady_tok_s}) in "
              f"{row['dispatch_s']:.1f} s, ramp {shape.get('ramp_s')} s, steady running "
              f"{shape.get('steady_running_mean')} queued {shape.get('steady_queued_mean')} (rc {run.rc})")
    lengths = runs.lengths(out / spec.dataset) if regime == "long" else []
    return row, trace, lengths


def _log_size(server: servers.Server) -> int:
    try:
        return server.log.stat().st_size
    except OSError:
        return 0


def _graph_share(server: servers.Server, start: int) -> dict:
    """The server's decode log lines written during a run: how many said `cuda graph: True` / `False`
    (SGLang 0.5.17 metrics_reporter.py report_decode_stats), and the running counts of each."""
    try:
        with server.log.open("rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return {}
    out: dict[str, Any] = {"true": 0, "false": 0, "running_true": [], "running_false": []}
    for line in text.splitlines():
        if "Decode batch" not in line or "cuda graph: " not in line:
            continue
        flag = "true" if "cuda graph: True" in line else "false"
        out[flag] += 1
        running = line.split("#running-req: ", 1)[1].split(",", 1)[0] if "#running-req: " in line else ""
        if running.isdigit():
            out[f"running_{flag}"].append(int(running))
    for flag in ("true", "false"):
        xs = out.pop(f"running_{flag}")
        out[f"running_{flag}_median"] = statistics.median(xs) if xs else None
    return out


def summarize_regimes(rows: list[dict]) -> dict:
    """Per regime: each client's median, spread (max - min over the median) and rounds, and adaptive over
    the best of the others (medians), whole run and steady state."""
    out: dict[str, dict] = {}
    for regime in REGIMES:
        per = {}
        for client in REGIMES[regime].clients:
            mine = [r for r in rows if (r["regime"], r["client"]) == (regime, client) and r["rc"] == 0]
            if not mine:
                continue
            tok = [r["tok_s"] for r in mine]
            steady = [r["steady_tok_s"] for r in mine if r["steady_tok_s"]]
            shapes = [r["trace_summary"] for r in mine]
            per[client] = {
                "rounds": len(mine), "tok_s_median": round(statistics.median(tok), 1),
                "spread": round((max(tok) - min(tok)) / statistics.median(tok), 3),
                "steady_tok_s_median": round(statistics.median(steady), 1) if steady else None,
                "ramp_s_median": _median([s.get("ramp_s") for s in shapes]),
                "steady_running_median": _median([s.get("steady_running_mean") for s in shapes]),
                "steady_queued_median": _median([s.get("steady_queued_mean") for s in shapes]),
                "queued_max": max((s.get("steady_queued_max") or 0) for s in shapes),
                "retractions_max": max((s.get("retractions") or 0) for s in shapes),
                "retractions_each": [int(s.get("retractions") or 0) for s in shapes],
                "client_cpu_ms_per_1k_tokens_median": _median([r.get("client_cpu_ms_per_1k_tokens") for r in mine]),
                "client_core_share_median": _median([r.get("client_core_share") for r in mine]),
                "diagnose": mine[-1].get("diagnose")}
        entry: dict[str, Any] = {"clients": per}
        if "adaptive" in per and len(per) > 1:
            others = {c: v for c, v in per.items() if c != "adaptive"}
            best = max(others, key=lambda c: others[c]["tok_s_median"])
            best_steady = max((v["steady_tok_s_median"] or 0 for v in others.values()), default=0)
            a = per["adaptive"]
            entry.update(best_fixed=best, adaptive_over_best=round(a["tok_s_median"] / others[best]["tok_s_median"], 3),
                         adaptive_over_best_steady=round((a["steady_tok_s_median"] or 0) / best_steady, 3)
                         if best_steady else None,
                         adaptive_over_best_per_round=_per_round(rows, regime))
            paired = entry["adaptive_over_best_per_round"]
            entry["adaptive_over_best_per_round_median"] = _median(list(paired.values())) if paired else None
            normalized = _per_round(rows, regime, _slot_seconds)
            entry["adaptive_over_best_per_round_gpu_normalized"] = normalized
            entry["adaptive_over_best_per_round_gpu_normalized_median"] = (
                round(statistics.median(normalized.values()), 3) if normalized else None)
        out[regime] = entry
    return out


def _per_round(rows: list[dict], regime: str, figure: Any = None) -> dict[str, float]:
    """Adaptive over the best other client of the same round (the GPU's rate drifts between rounds), by
    `figure(row)` (default: whole-run tok/s); rounds where a figure is missing are left out."""
    figure = figure or (lambda r: r["tok_s"])
    out = {}
    for rnd in sorted({r["round"] for r in rows if r["regime"] == regime}):
        mine = {r["client"]: figure(r) for r in rows if (r["regime"], r["round"]) == (regime, rnd) and r["rc"] == 0}
        others = [v for c, v in mine.items() if c != "adaptive" and v]
        if mine.get("adaptive") and others:
            out[str(rnd)] = round(mine["adaptive"] / max(others), 3)
    return out


def _slot_seconds(row: dict) -> float | None:
    """Whole-run tok/s over the GPU's decode rate per running request in that run's steady state: the
    requests kept decoding, on average, with the GPU's own speed factored out. Back-to-back runs of one
    client decoded 280-375 tokens/s per running request at the same batch (H200 run 4): the drift that
    whole-run ratios carry. What the client decides (running over time, ramp, tail) stays in it."""
    s = row.get("trace_summary") or {}
    rate, running = s.get("steady_gen_throughput_mean"), s.get("steady_running_mean")
    if not rate or not running:
        return None
    return row["tok_s"] / (rate / running)


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 2) if vals else None

