"""The GPU check's tables for docs/measurements.md, from the committed results of a real run.

`python -m bench gpu_h200` (or `python -m bench.gpu.report [RESULTS_JSON]`) reads
bench/gpu/h200_results.json (bench/gpu/run_h200.sh writes it as OUT/h200_results.json) and writes
section "gpu_h200" of docs/measurements.md and bench/results.json. Nothing here needs a GPU.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from bench.gpu import ceiling, regimes
from bench.gpu.tune_check import GOAL as GOAL_TUNE
from bench.report import md_table, write_section

RESULTS = Path(__file__).resolve().parent / "h200_results.json"
COMMAND = ("bash bench/gpu/run_h200.sh KEEP OUT install model setup serve sweep; "
           "... KEEP OUT adaptive kill unserve launch; ... KEEP OUT starved probe summary")


def _m(run: dict, key: str):
    return (run.get("server_metrics") or {}).get(key)


def throughput_table(r: dict) -> str:
    rows = []
    named = [(f"fixed {k}", v) for k, v in r["sweep"].items()] + [
        (f"adaptive #{i + 1}", a) for i, a in enumerate(r.get("adaptive", []))]
    for name, v in named:
        windows = v["controller"]["windows"]
        server = _m(v, "median sglang:gen_throughput")
        rows.append([name, f"{v['tok_s']:,.0f}", f"{server:,.0f}" if server else "-", f"{v['completion_tokens']:,}",
                     v["dispatch_s"],
                     _m(v, "median sglang:num_running_reqs"), _m(v, "median sglang:num_queue_reqs"),
                     _m(v, "max sglang:token_usage"), int(_m(v, "max sglang:num_retracted_reqs") or 0),
                     "-" if name.startswith("fixed") else "/".join(map(str, windows[:-1])),
                     v["empty_assistant_turns"]])
    return md_table(["client", "gen tok/s", "server gen tok/s (median)", "completion tokens", "s",
                     "running (median)", "queued (median)",
                     "KV usage (max)", "retracted", "window (log lines)", "empty turns"], rows)


def ratios(r: dict) -> dict:
    sweep = {k: v["tok_s"] for k, v in r["sweep"].items()}
    best = max(sweep, key=sweep.get)
    adaptive = statistics.median(a["tok_s"] for a in r["adaptive"])
    return {"best_fixed": best, "best_fixed_tok_s": sweep[best], "adaptive_median_tok_s": round(adaptive, 1),
            "adaptive_over_best_fixed": round(adaptive / sweep[best], 3),
            "adaptive_over_fixed_128": round(adaptive / sweep["128"], 3)}


def kill_text(k: dict) -> str:
    attempts = ", ".join(f"kill -9 #{i + 1} at {a['rows_after']} rows (rc {a['rc']})"
                         for i, a in enumerate(k["attempts"]))
    return (f"{attempts}; resume rc {k['resume_rc']}: {k['rows']:,} rows, {k['duplicates']} duplicated, "
            f"{k['missing']} missing, {k['unparseable']} unparseable; `validate` rc {k['validate']['rc']} "
            f"({k['empty_assistant_turns']} empty assistant turns written)")


def starved_table(st: dict) -> str:
    rows = []
    for name, v in st.items():
        if not isinstance(v, dict) or "controller" not in v:
            continue
        rows.append([name, f"{v['tok_s']:,.0f}", v["rows"], _m(v, "median sglang:num_running_reqs"),
                     _m(v, "max sglang:num_queue_reqs"), _m(v, "max sglang:num_retracted_requests_total") or 0,
                     _m(v, "max sglang:num_retracted_reqs") or 0, v["controller"]["retracted_max"],
                     "yes" if v["controller"]["retracted_seen"] else "no"])
    return md_table(["run (20,000 KV tokens)", "gen tok/s", "rows", "running (median)", "queued (max)",
                     "server counter (max)", "server gauge (max)", "controller: retracted", "in the progress line"],
                    rows)


def _probe_line(probe: dict) -> str:
    if not probe:
        return "not run"
    if probe.get("reports"):
        return f"`gen-pipeline {probe['command'].split(' ', 2)[-1]}`:"
    errors = [ln.strip(" |") for ln in probe.get("stdout_tail", []) if "Error" in ln or "error:" in ln]
    return f"FAILED (rc {probe.get('rc')}): {errors[-1][:240] if errors else 'no output'}"


def probe_table(r: dict) -> str:
    rows = []
    for label, key in (("bf16 vs fp8_e4m3 KV", "probe"), ("bf16 vs itself (noise floor)", "probe_floor")):
        for rep in (r.get(key) or {}).get("reports", {}).values():
            a, d = rep["aggregate"], rep["aggregate"]["first_divergence"]
            rows.append([label, a["prompts"], f"{100 * a['exact_match_share']:.1f} %", d["median"],
                         a["positions"], f"{100 * a['top1_change_share']:.2f} %",
                         f"{a['abs_dlogprob_mean']:.4f} / {a['abs_dlogprob_p99']:.4f}", f"{a['kl_mean']:.1e}",
                         rep["verdict"]])
    return md_table(["servers", "prompts", "exact match", "first divergence (median)", "positions",
                     "top-1 changed", "abs dlogprob mean / p99", "KL mean (lower bound)", "verdict"], rows)


def markdown(r: dict) -> str:
    q, launch, model = ratios(r), r.get("launch", {}), r.get("model", {})
    lengths = r.get("lengths") or []
    mean_p = statistics.mean(p for p, _ in lengths) if lengths else 0
    mean_o = statistics.mean(o for _, o in lengths) if lengths else 0
    probe = r.get("probe") or {}
    probe_line = _probe_line(probe)
    return "\n".join([
        "## Real SGLang 0.5.17 on one H200 (`python -m bench gpu_h200`, runs of `bench/gpu/`)",
        "",
        f"Run {r.get('date')}: `{COMMAND}` (bench/gpu/README.md; results: bench/gpu/h200_results.json). "
        f"Random-weight Llama, {model.get('params', 0) / 1e9:.2f}B parameters (hidden {model.get('hidden')}, "
        f"{model.get('layers')} layers, {model.get('heads')} heads, {model.get('kv_heads')} KV heads, vocab "
        f"{model.get('vocab_size')}); `--attention-backend triton --sampling-backend pytorch --enable-metrics "
        f"--max-total-tokens 60000`; {r.get('prompts'):,} prompts (mean {mean_p:.0f} prompt tokens), temperature 1, "
        f"EOS honoured, max_new_tokens 512 (mean output {mean_o:.0f}). Attach mode on one server, prefix cache "
        f"flushed before each run; tok/s = completion tokens / (server in hand -> CLI exit). Server ready after "
        f"{r['serve']['ready_s']:.0f} s (first start on the machine: JIT + CUDA graphs).",
        "",
        throughput_table(r),
        "",
        f"Adaptive (median of {len(r['adaptive'])}) / best fixed ({q['best_fixed']}): "
        f"**{q['adaptive_over_best_fixed']}**; / fixed 128: {q['adaptive_over_fixed_128']}. The KV-bound runs "
        "(fixed 256, all at once, adaptive: 140-150 running) spread 14.1K-17.0K tok/s at the same running count "
        "and KV use; fixed 256 and all at once had the same server-side median decode rate (15.4K) yet ended at "
        "15.0K and 17.0K, so one run per client does not order 128 / 256 / all. The runs went in table order "
        "and the server's own median decode rate fell over the session (15.4K in the fixed 256 / all runs, "
        "14.6K, 14.6K, 14.1K, 12.9K in adaptive #1-4 at the same running count), which the adaptive figures "
        "carry; a rerun should interleave the clients. Pooled with the first H200 run (bench sim_vs_real), "
        "adaptive / best fixed window is 0.972.",
        "",
        f"- kill -9 + resume (adaptive, attach): {kill_text(r['kill'])}.",
        f"- Launch mode from profile `h200-fp8` (fp8_e4m3 KV, no token cap): `{launch.get('ready_line')}`; "
        f"log line `{(launch.get('capacity_logged') or '')[22:110]}...`; {launch.get('rows')}/{launch.get('limit')} "
        f"rows, {launch.get('duplicates')} duplicated; processes left: {len(launch.get('leftover_processes') or [])}, "
        f"GPU apps left: {len(launch.get('gpu_apps') or [])}. SGLang warned: "
        f"\"{(launch.get('fp8_warning') or ['-'])[0][22:]}\"",
        "- KV-starved (`--max-total-tokens 20000`, --limit 1000): SGLang retracted nothing at its default admission "
        "with this length profile (outputs end early and free room steadily); with `--schedule-conservativeness "
        "0.3` (admission from new_token_ratio 0.21 instead of 0.7) it did, and the controller's figures (the "
        "progress line's `retracted N`, from the labelled counter that appears at the first retraction) showed it:",
        "",
        starved_table(r.get("starved", {})),
        "",
        f"- probe-kv: two servers side by side on the GPU (mem 0.4 each, 60,000 KV tokens), 200 "
        f"prompts, greedy, 256 new tokens, teacher forcing in chunks of 32; {probe_line}",
        "",
        probe_table(r),
        "",
        "The random model's next-token distribution is near-uniform (lm_head scaled down), so its top-1 margins "
        "are tiny and fp8 KV flips top-1 on 13 % of positions against a 0.55 % floor from batching alone; the "
        "logprobs move 26x the floor but stay small (0.0033 mean) and the KL is ~1e-7 nats. A trained model "
        "with real margins was not run (none can be fetched there). First attempts failed on two bugs fixed "
        "since: " + "; ".join(r.get("probe_first_attempts", [])) + ".",
    ])


HERE = Path(__file__).resolve().parent
# The regimes runs the report renders, newest last: (traces file, section, the commands that made it).
REGIMES_RUNS = (
    (HERE / "h200_traces.json", "gpu_h200_regimes",
     "CHECK_ARGS=\"--regimes long,short\" BUDGET_S=500 bash bench/gpu/run_h200.sh KEEP OUT install model setup "
     "serve regimes; CHECK_ARGS=\"--regimes long,short\" BUDGET_S=555 bash bench/gpu/run_h200.sh KEEP OUT regimes; "
     "CHECK_ARGS=\"--regimes long,short --rounds 5\" BUDGET_S=540 bash bench/gpu/run_h200.sh KEEP OUT regimes "
     "unserve summary"),
    (HERE / "h200_traces_run5.json", "gpu_h200_regimes_run5",
     "CHECK_ARGS=\"--regimes long --long-prompts 900 --clients all,adaptive --rounds 8\" BUDGET_S=535 bash "
     "bench/gpu/run_h200.sh KEEP OUT install model setup serve regimes; the same with BUDGET_S=575 ... regimes"),
    # profile h200-ceiling: a pool where SGLang's own admission runs the short regime past its CUDA-graph ceiling
    (HERE / "h200_traces_ceiling.json", "gpu_h200_ceiling",
     "CHECK_ARGS='--server-profile h200-ceiling --regimes short --rounds 4' bash bench/gpu/run_h200.sh KEEP OUT "
     "install model setup regimes (the command as reconstructed: the run did not record it)"),
    (HERE / "h200_traces_ceiling_run2.json", "gpu_h200_ceiling_run2",
     "CHECK_ARGS='--server-profile h200-ceiling --regimes short --clients adaptive,fixed-256,fixed-128 --rounds 4' "
     "bash bench/gpu/run_h200.sh KEEP OUT install model setup regimes (two calls)"),
    (HERE / "h100_traces_ceiling_run3.json", "gpu_h100_ceiling_run3",
     "CHECK_ARGS='--server-profile h200-ceiling --regimes short --clients adaptive,fixed-256 --rounds 6' "
     "BUDGET_S=400 bash bench/gpu/run_h200.sh KEEP OUT install model setup spec regimes, then BUDGET_S=520 ... "
     "regimes (two calls)"),
)
# the heading of a regimes section (the words docs and code point at), by the server profile of its run
TITLES = {"h200-ceiling": "Short outputs past SGLang's CUDA-graph ceiling, interleaved clients"}
SERVERS = {"h200": "60,000 bf16 KV tokens", "h200-ceiling": "120,000 fp8_e4m3 KV tokens, CUDA-graph ceiling 256",
           "h200-small": "400,000 bf16 KV tokens, 512 running, CUDA graphs up to 512",
           "h200-small-i1": "400,000 bf16 KV tokens, 512 running, CUDA graphs up to 512, --stream-interval 1",
           "h200-small-fast": "800,000 bf16 KV tokens, 1,024 running, CUDA graphs up to 1,024, 4 tokenizer workers"}
SERVERS["h200-small-i1-tw4"] = SERVERS["h200-small-i1"] + ", 4 tokenizer workers"
# the model each profile serves (bench/gpu/make_model.py SHAPES)
MODELS = {"h200-small": "the random-weight 9.8M Llama (shape `small`: hidden 512, 4 layers)"}
MODELS["h200-small-i1"] = MODELS["h200-small-fast"] = MODELS["h200-small"]
MODEL_1_2B = "the random-weight 1.16B Llama"


def _graph_line(runs: list[dict]) -> str:
    """Per client, the share of decode steps SGLang's log marked `cuda graph: False` and the running count then."""
    steps: dict[str, list[int]] = {}
    running: dict[str, list[float]] = {}
    for r in runs:
        g = r.get("cuda_graph") or {}
        if "false" not in g:
            continue
        s = steps.setdefault(r["client"], [0, 0])
        s[0], s[1] = s[0] + g["false"], s[1] + g["false"] + g.get("true", 0)
        if g.get("running_false_median") is not None:
            running.setdefault(r["client"], []).append(g["running_false_median"])
    if not steps:
        return ""
    parts = [f"{c} {100 * f / n:.0f} %" + (f" (at {statistics.median(running[c]):.0f} running)" if c in running else "")
             for c, (f, n) in steps.items() if n]
    return ("Decode steps SGLang ran without a CUDA graph (its decode log's `cuda graph: False`, all rounds): "
            + ", ".join(parts) + ".")


# SGLang's processes by the names /proc gives them (bench/gpu/servers.py group_cpu_s)
PROCESS_NAMES = {"sglang::schedul": "scheduler", "leader": "HTTP server + tokenizer manager",
                 "sglang::tokeniz": "tokenizer workers (all together)",
                 "sglang::detoken": "detokenizer"}


def _cpu_line(runs: list[dict]) -> str:
    """The median share of one core each of SGLang's processes and the client took over the runs."""
    shares: dict[str, list[float]] = {}
    for r in runs:
        for name, share in (r.get("server_core_share") or {}).items():
            if name in PROCESS_NAMES:
                shares.setdefault(name, []).append(share)
    if not shares:
        return ""
    client = [r["client_core_share"] for r in runs if r.get("client_core_share") is not None]
    parts = [f"{PROCESS_NAMES[n]} {statistics.median(v):.2f}" for n, v in shares.items()]
    return (f"CPU over each run, as a share of one core (medians of {len(runs)} runs): SGLang's "
            + ", ".join(parts) + (f"; gen_pipeline's client {statistics.median(client):.2f}" if client else "")
            + ". A process at 1.00 is a Python loop that binds: the batch the client keeps cannot go faster than it.")


def regimes_markdown(t: dict, source: str, command: str) -> str:
    """Issue 19's phase `regimes`: per regime each client's median of its rounds, spread, ramp, steady
    state, the largest queue at the server, retractions, diagnose; then adaptive / best per regime."""
    # the summary of the file's own runs, by today's rules
    runs = [r for regime in ("short", "long") if isinstance(t.get(regime), dict) for r in t[regime].get("runs", [])]
    summary = regimes.summarize_regimes(runs) if runs else (t.get("summary") or {})
    rows, ratio_rows = [], []
    for regime, entry in summary.items():
        for client, c in entry.get("clients", {}).items():
            rows.append([regime, client, c["rounds"], f"{c['tok_s_median']:,.0f}", f"{100 * c['spread']:.0f} %",
                         f"{c['steady_tok_s_median']:,.0f}" if c["steady_tok_s_median"] else "-", c["ramp_s_median"],
                         c["steady_running_median"], c["steady_queued_median"], c["queued_max"],
                         " / ".join(str(n) for n in c.get("retractions_each") or [c["retractions_max"]]),
                         c.get("client_cpu_ms_per_1k_tokens_median", "-"), c.get("client_core_share_median", "-"),
                         " ".join(c.get("diagnose") or []) or "-"])
        if entry.get("best_fixed"):
            paired = entry.get("adaptive_over_best_per_round") or {}
            ratio_rows.append([regime, entry["best_fixed"], f"**{entry['adaptive_over_best']}**",
                               entry.get("adaptive_over_best_steady"),
                               " / ".join(str(v) for v in paired.values()) or "-",
                               entry.get("adaptive_over_best_per_round_median", "-"),
                               " / ".join(str(v) for v in (entry.get("adaptive_over_best_per_round_gpu_normalized")
                                                           or {}).values()) or "-",
                               entry.get("adaptive_over_best_per_round_gpu_normalized_median", "-")])
    where = "the simulator (dry run)" if t.get("sim") else f"one {t['device']}" if t.get("device") else "the H200"
    counts = {regime: {r["rows"] for r in entry.get("runs", []) if r.get("rc") == 0}
              for regime, entry in t.items() if regime in ("short", "long") and isinstance(entry, dict)}
    what = {"short": "{:,} prompts, max 512",
            "long": "{:,} prompts of ~300-500 tokens, max_new_tokens 4096, min_tokens 1000"}
    regimes_run = "; ".join(f"{k}: {what[k].format(max(counts[k]))}" for k in ("short", "long") if counts.get(k))
    profile = next((t[g].get("profile") for g in ("short", "long") if isinstance(t.get(g), dict)), None) or "h200"
    title = TITLES.get(profile, "Short and long outputs, interleaved clients")
    graphs = "\n\n".join(x for x in (_graph_line(runs), _cpu_line(runs)) if x)
    return "\n".join([
        f"## {title} (`bench/gpu/` phase `regimes`): {source}",
        "",
        f"Run {t.get('date')} on {where} (SGLang 0.5.17, {MODELS.get(profile, MODEL_1_2B)} of "
        "bench/gpu/make_model.py): "
        f"`{command}` (bench/gpu/README.md; traces: bench/gpu/{source}). One server (profile {profile}: "
        f"{SERVERS.get(profile, SERVERS['h200'])}, `--stream-interval 8`); "
        f"{regimes_run}. Rounds interleave the regimes and "
        "rotate the clients; prefix cache flushed before each run. tok/s = completion tokens / (server in hand -> "
        "CLI exit); steady = the server's mean decode rate from 20 % of the run (after the ramp) to the last poll "
        "with requests queued; ramp = seconds to 90 % of the steady running count; client CPU = the CLI's user + "
        "sys CPU (streamed turns, the loop detector on) per 1K completion tokens, and as a share of one core over "
        "its run. Per round = adaptive / the best other client of the same round.",
        "",
        md_table(["regime", "client", "rounds", "tok/s (median)", "spread", "steady tok/s", "ramp s",
                  "steady running", "steady queued", "queued max", "retractions per run", "client CPU ms/1K tok",
                  "client core share", "diagnose"], rows),
        "",
        md_table(["regime", "best of the others", "adaptive / best (whole run)", "adaptive / best (steady)",
                  "adaptive / best per round", "per-round median",
                  "per round, the GPU's speed factored out", "its median"], ratio_rows),
        "",
        "The GPU's speed factored out: each run's whole-run tok/s over its decode rate per running request in "
        "steady state (bench/gpu/regimes.py `_slot_seconds`): back-to-back runs of one client decoded 280-375 "
        "tokens/s per running request at the same batch on run 4's host; what the client decides (running over "
        "time, ramp, tail) stays in the figure." + (f"\n\n{graphs}" if graphs else ""),
    ])


# The ceiling runs (issue 34, phase `ceiling`) the report renders: (traces file, section, the commands that made it).
CEILING_RUNS = (
    (HERE / "h200_traces_vs_sglang.json", "gpu_h200_vs_sglang",
     "CHECK_ARGS=\"--regimes short --short-prompts 1000 --rounds 2 --clients gen_pipeline,bench_serving,offline\" "
     "BUDGET_S=400 bash bench/gpu/run_h200.sh KEEP OUT install model setup serve ceiling unserve summary, then the "
     "same with --rounds 3, BUDGET_S=265 and the phases serve ceiling unserve summary (two calls)"),
    (HERE / "h100_traces_vs_sglang_small.json", "gpu_h100_vs_sglang_small",
     "CHECK_ARGS=\"--server-profile h200-small --regimes short --rounds 3\" BUDGET_S=400 bash bench/gpu/run_h200.sh "
     "KEEP OUT install model setup ceiling unserve summary (the budget ended before bench_serving's third round)"),
    (HERE / "h100_traces_vs_sglang_long.json", "gpu_h100_vs_sglang_long",
     "CHECK_ARGS=\"--regimes long --rounds 3\" BUDGET_S=470 bash bench/gpu/run_h200.sh KEEP OUT ceiling unserve "
     "summary, right after the small-model call on the same machine (the budget ended before bench_serving's third "
     "round)"),
    (HERE / "h100_traces_vs_sglang_long600.json", "gpu_h100_vs_sglang_long600",
     "CHECK_ARGS=\"--regimes long --long-prompts 600 --clients gen_pipeline,offline --rounds 3\" BUDGET_S=450 bash "
     "bench/gpu/run_h200.sh KEEP OUT install model setup serve ceiling summary, then the same with BUDGET_S=330 and "
     "the phases ceiling unserve summary (two calls; bench_serving left out: at 300 prompts it was the lower of "
     "SGLang's two, and the device time of this session fitted two clients)"),
    (HERE / "h100_traces_vs_sglang_long600_bs.json", "gpu_h100_vs_sglang_long600_bs",
     "CHECK_ARGS=\"--regimes long --long-prompts 600 --clients gen_pipeline,bench_serving --rounds 2\" BUDGET_S=370 "
     "bash bench/gpu/run_h200.sh KEEP OUT unserve ceiling unserve summary, the last call of the tune session (the "
     "budget ended before gen_pipeline's second round)"),
    (HERE / "h100_traces_vs_sglang_ceiling.json", "gpu_h100_vs_sglang_ceiling",
     "CHECK_ARGS=\"--server-profile h200-ceiling --regimes short --short-prompts 2000 --rounds 3 --clients "
     "gen_pipeline,bench_serving,offline\" BUDGET_S=540 bash bench/gpu/run_h200.sh KEEP OUT ceiling summary, right "
     "after the tune calls on the same machine. Output lengths are the model's EOS under max 512, on a pool past "
     "SGLang's CUDA-graph ceiling: SGLang's two clients ran 305-350 requests (slots), past the 256 its graphs "
     "cover; gen_pipeline ran ~245 with every decode step on a graph. Factoring the GPU's speed out divides by "
     "those slots, so it charges gen_pipeline for the faster step it chose: read the ratios by medians here"),
    (HERE / "h100_traces_readers_small.json", "gpu_h100_readers_small",
     "CHECK_ARGS=\"--server-profile h200-small --regimes short --rounds 3 --clients "
     "gen_pipeline,gen_pipeline-readers0,bench_serving\" BUDGET_S=470 bash bench/gpu/run_h200.sh KEEP OUT install "
     "model setup ceiling unserve summary (the budget ended before bench_serving's third round). gen_pipeline as "
     "shipped started 3 reader processes in each run; with --readers 0 its one process took 0.84-0.89 of a core. "
     "SGLang's scheduler process read one full core in every run, as it does where the GPU binds (it spins while "
     "it waits on the GPU): that figure does not say what bound this node; the two clients' equal rates say that "
     "neither client did"),
    (HERE / "h100_traces_readers_small_i1.json", "gpu_h100_readers_small_i1",
     "CHECK_ARGS=\"--server-profile h200-small-i1 --regimes short --rounds 3 --clients "
     "gen_pipeline,gen_pipeline-readers0,bench_serving\" BUDGET_S=440 bash bench/gpu/run_h200.sh KEEP OUT ceiling "
     "unserve summary, right after the interval-8 call on the same machine; gen_pipeline's rows of that call resumed "
     "the previous profile's output folders (the same names) and were dropped, and the device time left ran "
     "gen_pipeline once (`--rounds 1 --clients gen_pipeline,gen_pipeline-readers0`, BUDGET_S=190), not its "
     "--readers 0 variant. At SGLang's default --stream-interval 1 its HTTP front end (the `leader` process, "
     "0.95 of a core) bounds both clients: gen_pipeline kept 512 requests in flight while the scheduler ran ~47"),
    (HERE / "h100_traces_small_fast.json", "gpu_h100_small_fast",
     "CHECK_ARGS=\"--server-profile h200-small-fast --regimes short --rounds 3 --clients gen_pipeline,bench_serving\" "
     "BUDGET_S=336 bash bench/gpu/run_h200.sh KEEP OUT ceiling unserve summary, right after the frontend phase on "
     "the same profile (h100_frontend_fast_results.json). The server decodes at 58-74K tok/s in steady state (its "
     "own gen_throughput over the frontend run's polls), but a run of 3,000 short prompts lasts ~22 s, of which "
     "~5.5 s ramp to 1,024 running and a tail: whole-run rates are ~36K for both clients. Decode-log slots of "
     "gen_pipeline's runs (~580 against ~990 by its trace) undercount: read the ratios by medians"),
)
TUNE_RUNS = (
    (HERE / "h100_tune_results.json", "gpu_h100_tune",
     "CHECK_ARGS=\"--server-profile h200-ceiling --rounds 3 --tune-prompts 1500\" BUDGET_S=490 bash "
     "bench/gpu/run_h200.sh KEEP OUT install model setup tune summary, then the same with BUDGET_S=580 and the "
     "phases tune summary, then once more (tune stops between trials when the next would not end in the call's "
     "budget, and goes on from its state file); the phase's --levers were then cuda_graph_max_bs,"
     "num_continuous_decode_steps, and tune now skips the second (SGLang 0.5.17 never reads it)"),
    (HERE / "h100_tune_kv_results.json", "gpu_h100_tune_kv",
     "CHECK_ARGS=\"--server-profile h200-ceiling --rounds 2 --tune-prompts 1000 --levers "
     "kv_cache_dtype,mem_fraction_static\" BUDGET_S=276 ... tune summary, after the frontend calls on the same "
     "machine. The refusal is the finding: tune's output check, run on real SGLang, refused bf16 KV against the "
     "shipped fp8 on this random model, whose next-token distribution is near-uniform (top-1 margins of ~1e-3, as "
     "probe-kv found), so any change of the KV's rounding flips top-1 tokens; a trained model's margins are wider. "
     "bf16 was not faster by more than the noise either (19,654 against the shipped 18,544-20,464)"),
)


def tune_markdown(r: dict, source: str, command: str) -> str:
    """Issue 34: `gen-pipeline tune` on the device, its pick from round 1 judged by rounds 2..N."""
    t, v = r["tune"], r["tune"]["verdict"]
    levers, judged = t["levers"].replace(",", ", "), ", ".join(map(str, v["judged_rounds"]))
    later, ships = v["later_medians"], v["later_medians"][v["shipped"]]
    rows = [[name, *(f"{x:,}" for x in v["tok_s"][name]),
             *["- (refused: not tried again)"] * (v["rounds"] - len(v["tok_s"][name])),
             f"{later[name]:,}" if name in later else "-", f"{later[name] / ships:.3f}" if name in later else "-",
             v["checks"][name]] for name in v["names"]]
    return "\n".join([
        f"## `gen-pipeline tune` on one {r['device']} (`bench/gpu/` phase `tune`): {source}",
        "",
        f"Run {r['date']} (SGLang {r['sglang']}, {MODEL_1_2B}): `{command}`. tune launched the shipped profile "
        f"{v['shipped']} ({SERVERS[v['shipped']]}) and one candidate per lever ({levers}), each on the short "
        f"regime's next {t['prompts']:,} prompts sent at once (the same for each, prefix cache flushed), "
        f"{v['rounds']} rounds rotated. Round 1 alone is what a one-round budget gives; rounds {judged} measure every "
        "candidate again, independently of it.",
        "",
        md_table(["candidate", *(f"round {i + 1} tok/s" for i in range(v["rounds"])),
                  f"median of rounds {judged}", "vs shipped", "output check (round 1)"],
                 rows),
        "",
        f"- Round 1 picks **{v['pick_round1']}**: **{v['pick_vs_best']:.3f} x** the best by the later rounds' medians "
        f"({v['best_later']}) and {v['pick_vs_shipped']:.3f} x the shipped profile (goal: >= {GOAL_TUNE} x the best, "
        f"never below the shipped one: {'met' if v['goal_met'] else 'not met'}). With all rounds tune picks "
        f"{v['pick_all_rounds']}.",
        *(f"- Not tried: {ln.strip().removeprefix('skipped ')}" for ln in t["plan"] if ln.startswith("  skipped ")),
        *(["- The profile tune wrote (`outputs/<DATASET>/tune/<PROFILE>-tuned.toml`):", "", "```toml",
            t["written"].rstrip("\n"), "```"] if t.get("written") else
          [f"- tune wrote no file: the phase stopped it (exit {t['rc']}) after its last trial, before the table "
           "(the same command again prints it from tune's state)."]),
    ])

FRONTEND_RUNS = (
    (HERE / "h100_frontend_results.json", "gpu_h100_frontend",
     "CHECK_ARGS=\"--server-profile h200-small-i1\" BUDGET_S=200 bash bench/gpu/run_h200.sh KEEP OUT install model "
     "setup frontend, then the same with --server-profile h200-small-i1-tw4 and the phase frontend, back to back on "
     "one machine"),
    (HERE / "h100_frontend_fast_results.json", "gpu_h100_frontend_fast",
     "CHECK_ARGS=\"--server-profile h200-small-fast\" BUDGET_S=150 bash bench/gpu/run_h200.sh KEEP OUT install "
     "model setup frontend: the meter that reads the tokenizer workers, on a server with 4 of them"),
)
FRONTEND_PROFILES = {"h200-small": "--stream-interval 8", "h200-small-i1": "--stream-interval 1",
                     "h200-small-i1-tw4": "--stream-interval 1 --tokenizer-worker-num 4",
                     "h200-small-fast": "--stream-interval 8 --tokenizer-worker-num 4, 1,024 running"}


def _median_of(values: list) -> str:
    xs = [x for x in values if x is not None]
    return f"{statistics.median(xs):,.2f}" if xs and max(xs) < 100 else f"{statistics.median(xs):,.0f}" if xs else "-"


def _cli_seconds(summary: str) -> str:
    """The run's seconds as the CLI's last line says them ("+1,500 this run in 25s")."""
    found = re.search(r"this run in ([0-9hms]+)", summary or "")
    return found.group(1) if found else "-"


def _meter_line(profiles: dict) -> str:
    """What front_end_cpu measured: since the meter reads tokenizer workers too, the busiest process."""
    if all(f.get("front_end_meter") == "busiest" for f in profiles.values()):
        return ("front_end_cpu is the cores the busiest of SGLang's front-end processes used (the main process, or "
                "one of its --tokenizer-worker-num workers: an event loop each).")
    return ("front_end_cpu is the cores SGLang's main process used (the telemetry of this run read only it: with "
            "--tokenizer-worker-num 4 the HTTP server and tokenizer managers run in the workers, which it did not "
            "read, so there it is the main process's remaining work, not the front end's load).")


def frontend_markdown(r: dict, source: str, command: str) -> str:
    """diagnose's front_end_bound on launched SGLang servers (phase frontend), one row a profile."""
    rows = [[f"{p} (`{FRONTEND_PROFILES.get(p, '')}`)", SERVERS.get(p, "-"), f["rc"], _cli_seconds(f["summary"]),
             _median_of(f["gen_tok_s"]),
             _median_of(f["front_end_cpu"]), _median_of(f["client_cpu"]), ", ".join(f["rules"]) or "nothing"]
            for p, f in r["frontend"].items()]
    return "\n".join([
        f"## diagnose on SGLang's own front end (`bench/gpu/` phase `frontend`): {source}",
        "",
        f"Run {r.get('date')} on one {r.get('device', 'simulator')} (SGLang {r.get('sglang', '-')}, "
        f"{MODELS['h200-small']}): `{command}`. Each profile is launched by "
        f"`generate --server PROFILE --limit N` on the short prompts, then `diagnose` reads the run's telemetry. "
        f"{_meter_line(r['frontend'])} CLI seconds: the run's time as its last line says it; the other figures "
        "are medians over the run's telemetry rows.",
        "",
        md_table(["profile", "server", "exit code", "CLI seconds", "gen tok/s", "front_end_cpu (cores)",
                  "client_cpu (cores)", "diagnose names"], rows),
        "",
        *(f"- {p}: `{f['diagnose'][1]}`" for p, f in r["frontend"].items() if len(f["diagnose"]) > 1),
    ])


CLIENT_NAMES = {"gen_pipeline": "gen_pipeline (adaptive)", "bench_serving": "SGLang bench_serving, rate inf",
                "offline": "SGLang offline engine",
                "gen_pipeline-readers0": "gen_pipeline, answers read in the main process (--readers 0)",
                "gen_pipeline-readers4": "gen_pipeline, 4 reader processes (--readers 4)"}


def _joined(values: dict | None) -> str:
    return " / ".join(str(v) for v in (values or {}).values()) or "-"


def _main_cpu(v: dict) -> str:
    """The main process's CPU per 1K tokens where reader processes read the answers (run.log), and how many."""
    main, started = v.get("main_cpu_ms_per_1k_tokens_median"), v.get("readers_started")
    if not started:
        return "-"  # not gen_pipeline, or a run from before reader processes
    return "all (0)" if main is None else f"{main} ({' / '.join(map(str, started))})"


def ceiling_markdown(c: dict, source: str, command: str) -> str:
    """Issue 34's phase `ceiling`: per regime each client's medians, then gen_pipeline over each of SGLang's
    clients and the better of them: by medians, per round, and per round with the GPU's speed factored out."""
    runs = [r for regime in ("short", "long") if isinstance(c.get(regime), dict) for r in c[regime].get("runs", [])]
    summary = ceiling.summarize_ceiling(runs) if runs else (c.get("summary") or {})
    rows, ratio_rows = [], []
    for regime, entry in summary.items():
        for client, v in entry["clients"].items():
            rows.append([regime, CLIENT_NAMES.get(client, client), v["rounds"], f"{v['tok_s_median']:,.0f}",
                         f"{100 * v['spread']:.0f} %" if v["spread"] is not None else "-",
                         v["tok_s_per_running_median"] or "-", v["slots_log_median"] or "-",
                         v["slots_trace_median"] or "-", " / ".join(f"{t:,}" for t in v["prompt_tokens"]),
                         v["client_cpu_ms_per_1k_tokens_median"] or "-",
                         _main_cpu(v)])
        for key in ("over_bench_serving", "over_offline", "over_better", "over_gen_pipeline-readers0",
                    "over_gen_pipeline-readers4"):
            q = entry.get(key)
            if not q:
                continue
            against = "the better of the two" if key == "over_better" else CLIENT_NAMES[key[5:]]
            ratio_rows.append([regime, against, CLIENT_NAMES[q["of"]] if key == "over_better" else "",
                               f"**{q['median']}**", _joined(q["per_round"]), q["per_round_median"],
                               _joined(q["per_round_log"]), q["per_round_log_median"],
                               _joined(q["per_round_trace"]), q["per_round_trace_median"]])
    if all(r[-1] == "-" for r in rows):  # runs from before reader processes: no column for them
        rows = [r[:-1] for r in rows]
    where = "the simulator (dry run)" if c.get("sim") else f"one {c['device']}" if c.get("device") else "the H200"
    prompts = "; ".join(f"{k}: {v['prompts']:,} prompts, {v['prompt_tokens']:,} prompt tokens through the chat "
                        f"template" for k, v in (c.get("prompts") or {}).items())
    skipped = f" Offline engine not run: {c['offline_skipped']}." if c.get("offline_skipped") else ""
    if c.get("offline_errors"):
        skipped += (f" The offline engine failed {len(c['offline_errors'])} time(s), first: "
                    f"`{c['offline_errors'][0].splitlines()[0][:200]}`.")
    return "\n".join([
        f"## gen_pipeline against SGLang's own ceiling (`bench/gpu/` phase `ceiling`): {source}",
        "",
        f"Run {c.get('date')} on {where} (SGLang 0.5.17, {MODELS.get(c.get('profile') or 'h200', MODEL_1_2B)} of "
        "bench/gpu/make_model.py): "
        f"`{command}` (traces: bench/gpu/{source}, key `ceiling`). On the regimes phase's server (profile "
        f"{c.get('profile', 'h200')}: {SERVERS.get(c.get('profile') or 'h200', SERVERS['h200'])}, `--stream-interval "
        f"8`), prompts and sampling ({prompts}): gen_pipeline's adaptive client; SGLang's own HTTP client "
        "`python -m sglang.bench_serving --backend sglang --request-rate inf` over the same prompts (rendered "
        "through the model's chat template, as the server's chat endpoint renders them) with the same native "
        "sampling_params; SGLang's offline engine (`sglang.Engine`, no HTTP) on the same token ids, started once "
        "per call with the server's flags beside the idle server. Rounds interleave the regimes and rotate the "
        "clients; prefix cache flushed before each run. tok/s as each tool reports it: gen_pipeline completion "
        "tokens / (server in hand -> CLI exit), bench_serving its output_throughput, the engine completion tokens "
        f"/ its generate call.{skipped}",
        "",
        md_table(["regime", "client", "rounds", "tok/s (median)", "spread", "decode tok/s per running request",
                  "slots (decode log)", "slots (trace)", "prompt tokens", "client CPU ms/1K tok",
                  "of it, the main process (readers)"][:len(rows[0]) if rows else None], rows),
        "",
        md_table(["regime", "gen_pipeline over", "(the better)", "by medians", "per round", "per-round median",
                  "per round, GPU factored out (decode log)", "its median", "per round, GPU factored out (trace)",
                  "its median"], ratio_rows),
        "",
        "The GPU's speed factored out (bench/gpu/ceiling.py): each run's tok/s over its decode rate per running "
        "request in steady state (slots: the requests kept decoding, on average), as the regimes phase's "
        "`_slot_seconds`; read from SGLang's `Decode batch` log lines for all three clients (the engine has no "
        "/metrics) and from the per-second trace for the two HTTP clients. A client that runs a smaller batch "
        "gets a faster step, so slots compare clients best at similar running counts (the table shows them).",
    ])


SPEC_RUNS = (
    (HERE / "h100_spec_results.json", "gpu_h100_spec",
     "BUDGET_S=380 bash bench/gpu/run_h200.sh KEEP OUT install model setup spec"),
)


def spec_markdown(r: dict, source: str, command: str) -> str:
    """Issue 34: speculative decoding through the launcher, each turn's acceptance against the server's log."""
    s = r["spec"]
    logged = [float(x.split("accept len: ", 1)[1].split(",", 1)[0]) for x in s.get("server_log_accept", [])
              if "accept len: " in x]
    shown = s.get("status_spec_acceptance") or {}
    return "\n".join([
        f"## Speculative decoding through the launcher (`bench/gpu/` phase `spec`): {source}",
        "",
        f"Run {r.get('date')} on one {r.get('device')} (SGLang 0.5.17, {MODEL_1_2B}): `{command}`. "
        "Profile h200-spec: `--speculative-algorithm STANDALONE` with the target itself as its draft (the same "
        f"weights and tokenizer), {SPEC_STEPS_WORDS}, `--disable-cuda-graph` (0.5.17's draft-graph capture imports "
        "deep_gemm, which the offline wheel set lacks); greedy, whole answers (`on_loop = \"off\"`: meta_info comes "
        "only to a request that does not stream).",
        "",
        md_table(["figure", "value"], [
            ["exit code of `generate --server h200-spec`", s["rc"]],
            ["SGLang ready line", s.get("ready_line") or "-"],
            ["turns written / with an acceptance", f"{s['rows']} / {s['turns_with_acceptance']}"],
            ["accept length per turn: median (min-max)",
             f"{s['accept_length_median']:.2f} ({s['accept_length_min']:.2f}-{s['accept_length_max']:.2f})"],
            ["completion tokens / verify steps, all turns",
             f"{s['completion_tokens_total']:,} / {s['verify_ct_total']:,} = "
             f"{s['completion_tokens_total'] / max(1, s['verify_ct_total']):.2f}"],
            ["`status --json` spec_acceptance", f"{shown.get('accept_length')} over {shown.get('turns')} "
                                                f"{shown.get('scope')}"],
            ["SGLang's decode log `accept len` (first lines)", " / ".join(f"{x:.2f}" for x in logged) or "-"],
        ]),
        "",
        f"The expected length with a perfect draft is {s['expected_accept_length']} (3 steps + the bonus token). "
        "The random model's next-token distribution is near-uniform (tiny top-1 margins, as probe-kv found), so "
        "the draft's argmax, "
        "computed in another batch shape, differs from the target's on most positions and SGLang itself logs accept "
        "lengths of 1.2-1.3: what the rows record is what the server measured. The gain needs a trained draft.",
    ])


SPEC_STEPS_WORDS = "3 draft steps, top-k 1, 4 draft tokens"


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    path = Path(argv[0]) if argv else RESULTS
    r = json.loads(path.read_text())
    for traces, section, command in REGIMES_RUNS:
        if not traces.exists():
            continue
        t = json.loads(traces.read_text())
        if not any(isinstance(t.get(g), dict) for g in ("short", "long")):
            continue  # a file of another phase (ceiling) only
        regimes_text = regimes_markdown(t, traces.name, command)
        print(regimes_text)
        runs = [x for g in ("short", "long") if isinstance(t.get(g), dict) for x in t[g].get("runs", [])]
        write_section(section, {"summary": regimes.summarize_regimes(runs) if runs else t.get("summary"),
                                "date": t.get("date")}, regimes_text, stamped=False)
    for traces, section, command in CEILING_RUNS:
        c = json.loads(traces.read_text()).get("ceiling") if traces.exists() else None
        if c:
            ceiling_text = ceiling_markdown(c, traces.name, command)
            print(ceiling_text)
            write_section(section, {"summary": c.get("summary"), "date": c.get("date")}, ceiling_text, stamped=False)
    for source, section, command in TUNE_RUNS:
        if source.exists():
            tune_text = tune_markdown(json.loads(source.read_text()), source.name, command)
            print(tune_text)
            write_section(section, {"verdict": json.loads(source.read_text())["tune"]["verdict"]}, tune_text,
                          stamped=False)
    for source, section, command in FRONTEND_RUNS:
        if source.exists():
            frontend_text = frontend_markdown(json.loads(source.read_text()), source.name, command)
            print(frontend_text)
            write_section(section, {"frontend": {p: {k: f[k] for k in ("rc", "rules")} for p, f in
                                                 json.loads(source.read_text())["frontend"].items()}},
                          frontend_text, stamped=False)
    for source, section, command in SPEC_RUNS:
        if source.exists():
            spec_text = spec_markdown(json.loads(source.read_text()), source.name, command)
            print(spec_text)
            write_section(section, {"spec": json.loads(source.read_text())["spec"]}, spec_text, stamped=False)
    text = markdown(r)
    print(text)
    summary = {"ratios": ratios(r), "summary": r.get("summary"), "kill": {k: r["kill"][k] for k in
               ("rows", "duplicates", "missing", "unparseable", "empty_assistant_turns")},
               "launch_ready_s": r.get("launch", {}).get("ready_s"), "date": r.get("date")}
    write_section("gpu_h200", summary, text, stamped=False)
    return summary


if __name__ == "__main__":
    main()
