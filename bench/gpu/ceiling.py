"""Phase `ceiling` of the GPU check (issue 34, part 1): gen_pipeline against SGLang's own ceiling.

On the regimes phase's server, model, prompts and sampling, per round and per regime (short, long; the
regimes alternate, the clients rotate), the prefix cache flushed before each run:
- gen_pipeline: the adaptive client, exactly as phase `regimes` runs it (bench/gpu/regimes.py `measure`);
- bench_serving: SGLang's own HTTP client at full rate, `python -m sglang.bench_serving --backend sglang
  --request-rate inf` over the same prompts (a ShareGPT-shaped file of them, rendered with the model's chat
  template as the server's chat endpoint renders them), the same sampling as SGLang's native
  sampling_params (EOS honoured, min_new_tokens where the regime sets min_tokens);
- offline: SGLang's offline engine (`sglang.Engine`, bench/gpu/offline_engine.py) on the same token ids and
  sampling, started once per call with the server's own flags, beside the idle server (see bench/gpu/README.md).
Each run records tok/s as its own tool reports it, its client CPU, the server's (or engine's) decode log
over the run and, for the two HTTP clients, the per-second trace of phase `regimes`. The GPU's speed is
factored out per run as the regimes phase does (`_slot_seconds`: tok/s over the decode rate per running
request in steady state), read from SGLang's decode log lines for all three clients (the offline engine has
no /metrics) and, for the HTTP clients, from the trace as well. Runs accumulate in results.json
("ceiling") and, with their traces and the summary, under "ceiling" in traces.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from bench.gpu import offline_engine as offline
from bench.gpu import regimes, runs, servers
from bench.gpu.setup import PROFILE_KV_TOKENS
from bench.gpu.traces import TracePoller, summarize

CLIENTS = ("gen_pipeline", "bench_serving", "offline")
# only where --clients names them: gen_pipeline with its answers read in the main process (no reader
# processes), and in 4 reader processes from the start (the default chooses as the run goes)
EXTRA_CLIENTS = {"gen_pipeline-readers0": ("--readers", "0"), "gen_pipeline-readers4": ("--readers", "4")}
ROUNDS = 3
SERVER_START_S = 120.0  # the server's start again after an offline run alone (--offline-alone; ~80 s on the H200)
# bench_serving sleeps 1 s after this line, then sends every request (sglang/benchmark/serving.py, 0.5.17)
WARMED = re.compile(r"^Warmup completed")
WARMUP_SLEEP_S = 1.0
# SGLang's /generate (and Engine) sampling_params name for a chat-completions body key of [sampling.extra_body]
# (sglang/srt/entrypoints/openai/protocol.py ChatCompletionRequest.to_sampling_params, 0.5.17)
NATIVE_NAMES = {"min_tokens": "min_new_tokens", "top_k": "top_k", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty", "stop": "stop", "ignore_eos": "ignore_eos"}
_DECODE = re.compile(r"#running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)")


def plan(rounds: int = ROUNDS, order: tuple[str, ...] = ("short", "long"),
         clients: tuple[str, ...] = CLIENTS, offline_first: bool = False) -> list[tuple[int, str, str]]:
    """(round, regime, client) in the order they run: regimes alternate, clients rotate; `offline_first`:
    the offline engine first in each round and regime, the others rotating after it (--offline-alone)."""
    out = []
    for r in range(1, rounds + 1):
        for regime in (order if r % 2 else order[::-1]):
            rest = tuple(c for c in clients if not (offline_first and c == "offline"))
            k = (r - 1) % len(rest)
            head = [(r, regime, "offline")] if offline_first and "offline" in clients else []
            out += head + [(r, regime, c) for c in rest[k:] + rest[:k]]
    return out


def native_sampling(dataset_toml: Path) -> dict[str, Any]:
    """The dataset's [sampling] as SGLang's native sampling_params (what /generate and Engine take)."""
    s = tomllib.loads(dataset_toml.read_text())["sampling"]
    out = {"max_new_tokens": s["max_new_tokens"], "temperature": s["temperature"], "top_p": s["top_p"],
           "ignore_eos": False}
    for key, value in (s.get("extra_body") or {}).items():
        if key not in NATIVE_NAMES:
            raise ValueError(f"{dataset_toml}: [sampling.extra_body] {key} has no native name here; add it to "
                             "bench/gpu/ceiling.py NATIVE_NAMES (SGLang's protocol.py to_sampling_params)")
        out[NATIVE_NAMES[key]] = value
    return out


def write_prompts(check: Any, regime: str, n: int, tokenizer_dir: Path) -> dict[str, Any]:
    """The first n prompts of the regime's dataset through the model's chat template: a ShareGPT-shaped
    file for bench_serving (the rendered text) and the token ids for the engine. Returns the paths, the
    prompt tokens and how many texts re-tokenize to other ids than the template's (0: the same prompts)."""
    from transformers import AutoTokenizer

    dataset = regimes.REGIMES[regime].dataset
    toml = tomllib.loads((check.cfg / f"{dataset}.toml").read_text())
    rows = Path(toml["source"]["files"][0]).read_text().splitlines()[:n]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts, ids = [], []
    for line in rows:
        messages = json.loads(line)["messages"]
        texts.append(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        ids.append(list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                return_dict=False)))
    folder = check.work / "ceiling-prompts"
    folder.mkdir(parents=True, exist_ok=True)
    sharegpt, id_file = folder / f"{regime}-{n}.sharegpt.json", folder / f"{regime}-{n}.ids.json"
    # bench_serving keeps the first two turns and sends the first as the prompt (datasets/sharegpt.py); the
    # second's length is only used without --sharegpt-output-len
    sharegpt.write_text(json.dumps([{"id": f"{regime}-{i}", "conversations": [
        {"from": "human", "value": t}, {"from": "gpt", "value": "unused unused"}]} for i, t in enumerate(texts)]))
    id_file.write_text(json.dumps(ids))
    differ = sum(tok.encode(t, add_special_tokens=False) != i for t, i in zip(texts, ids, strict=True))
    return {"sharegpt": sharegpt, "ids": id_file, "prompts": len(ids), "prompt_tokens": sum(map(len, ids)),
            "retokenized_differ": differ}


def bench_serving_argv(python: str, sim: bool, url: str, prompts: dict, sampling: dict, tokenizer_dir: Path,
                       output_file: Path) -> list[str]:
    """`python -m sglang.bench_serving` (0.5.17) at full rate over our prompts with our sampling; in a dry
    run through bench/gpu/sglang_client.py (SGLang's runtime is not importable there)."""
    module = "bench.gpu.sglang_client" if sim else "sglang.bench_serving"
    return [python, "-m", module, "--backend", "sglang", "--base-url", url, "--dataset-name", "sharegpt",
            "--dataset-path", str(prompts["sharegpt"]), "--num-prompts", str(prompts["prompts"]),
            "--sharegpt-output-len", str(sampling["max_new_tokens"]), "--request-rate", "inf",
            "--temperature", str(sampling["temperature"]), "--top-p", str(sampling["top_p"]),
            "--disable-ignore-eos", "--extra-request-body", json.dumps({"sampling_params": sampling}),
            "--tokenizer", str(tokenizer_dir), "--flush-cache", "--disable-tqdm",
            "--output-file", str(output_file)]


def sglang_python(sim: bool) -> str:
    """The Python that has SGLang: $SGLANG_PYTHON, else in a dry run the contract venv's, else ours."""
    if os.environ.get("SGLANG_PYTHON"):
        return os.environ["SGLANG_PYTHON"]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    contract = cache / "gen-pipeline/venv-contract/bin/python"
    if sim and contract.exists():
        return str(contract)
    return os.environ.get("BENCH_PYTHON", sys.executable)


def decode_speed(log: Path, start: int) -> dict[str, Any]:
    """SGLang's decode log lines written from byte `start` of `log` (scheduler `Decode batch` lines, every 40
    steps): the decode rate per running request in the run's steady state, from 20 % of its lines to the last
    one with requests queued (all of them when none was), as the trace's steady state is taken."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return {"lines": 0}
    points = [(int(m[1]), float(m[2]), int(m[3])) for m in _DECODE.finditer(text)]
    if not points:
        return {"lines": 0}
    queued = [i for i, p in enumerate(points) if p[2] > 0]
    first, last = int(0.2 * len(points)), (queued[-1] if queued else len(points) - 1)
    steady = points[first:last + 1] if last >= first else points
    running = sum(p[0] for p in steady)
    return {"lines": len(points), "steady_lines": len(steady),
            "running_mean": round(running / len(steady), 1),
            "gen_tok_s_mean": round(sum(p[1] for p in steady) / len(steady), 1),
            "tok_s_per_running": round(sum(p[1] for p in steady) / running, 2) if running else None}


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _normalize(row: dict) -> dict:
    """Each way of factoring the GPU's speed out of this run's tok/s (None where the run does not show it)."""
    rate = (row.get("decode_log") or {}).get("tok_s_per_running")
    row["slots_log"] = round(row["tok_s"] / rate, 1) if rate and row["tok_s"] else None
    row["slots_trace"] = round(s, 1) if (s := regimes._slot_seconds(row)) else None
    return row


def run_name(check: Any, regime: str, client: str, rnd: int) -> str:
    """A run's output folder and log: the profile in it, so that another profile's ceiling runs in the same
    work folder never resume this one's output."""
    return f"ceiling-{getattr(check, 'server_profile', 'h200')}-{regime}-{client}-{rnd}"


def measure_gen_pipeline(check: Any, server: servers.Server, rnd: int, regime: str,
                         client: str = "gen_pipeline") -> tuple[dict, list[dict]]:
    start = _log_size(server.log)
    row, trace, _ = regimes.measure(check, server, rnd, regime, "adaptive", name=run_name(check, regime, client, rnd),
                                    extra=EXTRA_CLIENTS.get(client, ()))
    row.update(client=client, decode_log=decode_speed(server.log, start))
    return _normalize(row), trace


def measure_bench_serving(check: Any, server: servers.Server, rnd: int, regime: str, prompts: dict,
                          sampling: dict, tokenizer_dir: Path) -> tuple[dict, list[dict]]:
    name = run_name(check, regime, "bench_serving", rnd)
    output = check.out / f"{name}.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)
    argv = bench_serving_argv(sglang_python(check.sim), check.sim, server.url, prompts, sampling, tokenizer_dir,
                              output)
    servers.flush_cache(server)
    start = _log_size(server.log)
    poller = TracePoller(server.url)
    run = runs.run_cli(name, argv, check.logs, ready=WARMED)
    t0 = run.ready_mono + WARMUP_SLEEP_S if run.ready_mono is not None else 0.0
    trace = poller.stop(t0)
    lines = output.read_text().splitlines() if output.exists() else []
    result = json.loads(lines[-1]) if lines else {}
    shape = summarize(trace)
    row = {"round": rnd, "regime": regime, "client": "bench_serving", "rc": run.rc if result else (run.rc or 1),
           "rows": result.get("completed", 0), "completion_tokens": result.get("total_output_tokens", 0),
           "prompt_tokens": result.get("total_input_tokens", 0), "dispatch_s": round(result.get("duration", 0.0), 2),
           "wall_s": round(run.wall_s, 1), "tok_s": round(result.get("output_throughput", 0.0), 1),
           "steady_tok_s": shape.get("steady_gen_throughput_mean"), "client_cpu_s": round(run.cpu_s, 2),
           "client_cpu_ms_per_1k_tokens": round(1e6 * run.cpu_s / max(result.get("total_output_tokens", 0), 1), 2),
           "client_core_share": round(run.cpu_s / max(run.wall_s, 1e-6), 3), "trace_summary": shape,
           "decode_log": decode_speed(server.log, start), "command": " ".join(argv[1:]),
           "bench_serving": {k: result.get(k) for k in ("max_concurrent_requests", "concurrency", "median_ttft_ms",
                                                        "median_itl_ms", "request_throughput")}}
    if not result:
        row["error"] = "no result line: " + " | ".join(ln for _, ln in run.lines[-8:])
    elif row["rows"] != prompts["prompts"]:
        row["warning"] = f"{row['rows']} completed, expected {prompts['prompts']}"
    return _normalize(row), trace


def measure_offline(check: Any, engine: offline.Engine, rnd: int, regime: str, prompts: dict,
                    sampling: dict) -> dict:
    name = run_name(check, regime, "offline", rnd)
    check.out.mkdir(parents=True, exist_ok=True)
    if not engine.warmed:
        warm, _ = engine.run(prompts["ids"], sampling, check.out / f"{name}-warmup.json", warmup=True)
        engine.warmed = "error" not in warm
    start = _log_size(engine.log)
    result, wall_s = engine.run(prompts["ids"], sampling, check.out / f"{name}.json")
    row = {"round": rnd, "regime": regime, "client": "offline", "rc": 0 if "error" not in result else 1,
           "rows": result.get("completed", 0), "completion_tokens": result.get("total_output_tokens", 0),
           "prompt_tokens": result.get("total_input_tokens", 0), "dispatch_s": round(result.get("duration", 0.0), 2),
           "wall_s": round(wall_s, 1), "tok_s": round(result.get("output_throughput", 0.0), 1),
           "steady_tok_s": None, "trace_summary": {}, "decode_log": decode_speed(engine.log, start),
           "finish_reasons": result.get("finish_reasons")}
    if "error" in result:
        row["error"] = result["error"]
    return _normalize(row)


def offline_skip_reason(check: Any) -> str | None:
    """Why this call cannot run SGLang's offline engine (None: it can)."""
    return "dry run: SGLang's offline engine needs a GPU (sglang.Engine); not run" if check.sim else None


class OfflineSlot:
    """The call's offline engine: started at its first run, stopped at the end of the phase; once it fails to
    start or dies, the rest of the call goes on without it (the next call tries again)."""

    def __init__(self, check: Any, profile: str, res: dict, alone: bool = False):
        self.check, self.profile, self.res, self.alone = check, profile, res, alone
        self.engine: offline.Engine | None = None
        self.failed = False

    def start_s(self) -> float:
        return offline.START_S if self.engine is None else 0.0

    def measure(self, rnd: int, regime: str, prompts: dict, sampling: dict) -> dict | None:
        """One offline run; `alone`: the server stopped first, the engine stopped after it."""
        try:
            if self.alone:
                _stop_server(self.check, self.profile)
            return self._measure(rnd, regime, prompts, sampling)
        finally:
            if self.alone:
                self.stop()

    def _measure(self, rnd: int, regime: str, prompts: dict, sampling: dict) -> dict | None:
        if self.engine is None:
            try:
                self.engine = offline.Engine.start(self.check.cfg, self.profile, self.check.logs)
            except RuntimeError as e:
                self._failed(str(e))
                return None
            self.res.setdefault("engine_ready_s", []).append(round(self.engine.ready_s, 1))
        row = measure_offline(self.check, self.engine, rnd, regime, prompts, sampling)
        if self.engine.proc.poll() is not None:
            self._failed(row.get("error") or f"the offline engine exited; see {self.engine.log}")
            self.engine = None
        return row

    def _failed(self, error: str) -> None:
        self.failed = True
        self.res.setdefault("offline_errors", []).append(error[:2000])
        self.check.log(f"ceiling: the offline engine failed; going on without it: {error[:300]}")
        self.check.save()

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None


def _server_key(profile: str) -> str:
    return "main" if profile == "h200" else profile


def _stop_server(check: Any, profile: str) -> None:
    """Stop the phase's server (it is started again before the next HTTP run), as phase unserve does."""
    key = _server_key(profile)
    s = check.server(key)
    if s is not None:
        check.log(f"ceiling: stopping {profile} for the offline engine (--offline-alone)")
        servers.stop(s)
    check.keep(key, None)


def run_phase(check: Any, rounds: int = ROUNDS) -> None:
    """Run what is missing of plan(rounds) while the budget lasts; then summarize."""
    regimes.configure(check)
    order = tuple(getattr(check, "regimes_order", None) or ("short", "long"))
    wanted = getattr(check, "clients", None)
    clients = tuple(c for c in (*CLIENTS, *EXTRA_CLIENTS) if (c in CLIENTS and wanted is None)
                    or (wanted is not None and c in wanted))
    res = check.results.setdefault("ceiling", {"runs": []})
    if "offline" in clients and (reason := offline_skip_reason(check)):
        clients = tuple(c for c in clients if c != "offline")
        res["offline_skipped"] = reason
        check.log(f"ceiling: offline engine skipped ({reason})")
        check.save()
    if not clients:
        check.log("ceiling: no client to run (--clients names none of gen_pipeline, bench_serving, offline)")
        return
    profile = getattr(check, "server_profile", "h200")
    alone = bool(getattr(check, "offline_alone", False)) and "offline" in clients
    tokenizer_dir = tokenizer_for(check)
    done = {(r["round"], r["regime"], r["client"]) for r in res["runs"]}
    engine = OfflineSlot(check, profile, res, alone)
    prompts: dict[str, dict] = {}
    try:
        for rnd, regime, client in plan(rounds, order, clients, offline_first=alone):
            if (rnd, regime, client) in done or (client == "offline" and engine.failed):
                continue
            expect = _expect_s(res["runs"], regime, client) + _start_s(check, profile, engine, client)
            if check.left_s() < expect:
                check.log(f"ceiling: {check.left_s():.0f} s left, {regime}/{client} round {rnd} needs ~{expect:.0f} s: "
                          "stopping here (call the phase again to go on)")
                break
            spec = regimes.REGIMES[regime]
            sampling = native_sampling(check.cfg / f"{spec.dataset}.toml")
            if regime not in prompts:
                prompts[regime] = write_prompts(check, regime, spec.prompts, tokenizer_dir)
                res.setdefault("prompts", {})[regime] = {k: v for k, v in prompts[regime].items()
                                                         if k in ("prompts", "prompt_tokens", "retokenized_differ")}
            trace: list[dict] = []
            if client != "offline":  # started here: after an offline run alone it was stopped
                server = check.ensure(_server_key(profile), profile)
            if client.startswith("gen_pipeline"):
                row, trace = measure_gen_pipeline(check, server, rnd, regime, client)
            elif client == "bench_serving":
                row, trace = measure_bench_serving(check, server, rnd, regime, prompts[regime], sampling, tokenizer_dir)
            elif (offline_row := engine.measure(rnd, regime, prompts[regime], sampling)) is not None:
                row = offline_row
            else:
                continue
            _record(check, profile, row, trace)
    finally:
        engine.stop()


def _record(check: Any, profile: str, row: dict, trace: list[dict]) -> None:
    """One run into results.json ("ceiling") and traces.json ("ceiling", with its trace), the summary anew."""
    res = check.results["ceiling"]
    check.log(f"ceiling {row['regime']}/{row['client']} round {row['round']}: {row['rows']} rows, {row['tok_s']:.0f} "
              f"tok/s, slots (log) {row.get('slots_log')}, (trace) {row.get('slots_trace')} (rc {row['rc']})")
    res["runs"].append(row)
    traces_path = check.work / "traces.json"
    traces = json.loads(traces_path.read_text()) if traces_path.exists() else {}
    entry = traces.setdefault("ceiling", {"profile": profile, "kv_tokens": PROFILE_KV_TOKENS[profile]})
    entry.setdefault(row["regime"], {"runs": []})["runs"].append({**row, "trace": trace})
    res["summary"] = entry["summary"] = summarize_ceiling(res["runs"])
    entry.update(date=time.strftime("%Y-%m-%d", time.gmtime()), sim=check.sim, prompts=res.get("prompts"),
                 offline_skipped=res.get("offline_skipped"), offline_errors=res.get("offline_errors"),
                 device=None if check.sim else servers.gpu_name())
    traces_path.write_text(json.dumps(traces) + "\n")
    check.save()


def tokenizer_for(check: Any) -> Path:
    """The model's tokenizer folder; in a dry run the GPU check's own tokenizer, built once (the simulator
    has none to give)."""
    if not check.sim:
        return Path(check.results.get("model_path") or check.work / "model")
    folder = check.work / "sim-tokenizer"
    if not (folder / "tokenizer_config.json").exists():
        from bench.gpu.make_model import build_tokenizer
        build_tokenizer(folder)
    return folder


def _start_s(check: Any, profile: str, engine: OfflineSlot, client: str) -> float:
    """What a run must start first: the engine, or the server again after an offline run alone."""
    if client == "offline":
        return engine.start_s()
    return SERVER_START_S if check.server(_server_key(profile)) is None else 0.0


def _expect_s(rows: list[dict], regime: str, client: str) -> float:
    previous = [r["wall_s"] for r in rows if (r["regime"], r["client"]) == (regime, client)]
    return (previous[-1] if previous else regimes.REGIMES[regime].expect_s) + regimes.MARGIN_S


def summarize_ceiling(rows: list[dict]) -> dict:
    """Per regime: each client's median tok/s and slots over its rounds; gen_pipeline over each of SGLang's
    two clients and over the better of them, by medians, per round, and per round with the GPU's speed
    factored out (slots from the decode log; from the trace for the two HTTP clients)."""
    out: dict[str, dict] = {}
    for regime in ("short", "long"):
        mine = [r for r in rows if r["regime"] == regime and r["rc"] == 0]
        if not mine:
            continue
        per = {}
        for client in (*CLIENTS, *EXTRA_CLIENTS):
            xs = [r for r in mine if r["client"] == client]
            if not xs:
                continue
            tok = [r["tok_s"] for r in xs]
            per[client] = {"rounds": len(xs), "tok_s_median": round(statistics.median(tok), 1),
                           "spread": round((max(tok) - min(tok)) / statistics.median(tok), 3) if any(tok) else None,
                           "slots_log_median": regimes._median([r.get("slots_log") for r in xs]),
                           "slots_trace_median": regimes._median([r.get("slots_trace") for r in xs]),
                           "tok_s_per_running_median": regimes._median(
                               [(r.get("decode_log") or {}).get("tok_s_per_running") for r in xs]),
                           "prompt_tokens": sorted({int(r.get("prompt_tokens") or 0) for r in xs}),
                           "client_cpu_ms_per_1k_tokens_median": regimes._median(
                               [r.get("client_cpu_ms_per_1k_tokens") for r in xs]),
                           "main_cpu_ms_per_1k_tokens_median": regimes._median(
                               [r.get("main_cpu_ms_per_1k_tokens") for r in xs]),
                           "readers_started": sorted({r["readers_started"] for r in xs if "readers_started" in r})}
        entry: dict[str, Any] = {"clients": per}
        if "gen_pipeline" in per:
            for other in ("bench_serving", "offline", "better", *EXTRA_CLIENTS):
                ratios = _ratios(mine, other, per)
                if ratios:
                    entry[f"over_{other}"] = ratios
        out[regime] = entry
    return out


def _ratios(rows: list[dict], other: str, per: dict) -> dict | None:
    """gen_pipeline / `other` (a client, or "better": the better of SGLang's two in each comparison)."""
    others = ("bench_serving", "offline") if other == "better" else (other,)  # or gen_pipeline's other variant
    present = [c for c in others if c in per]
    if not present:
        return None
    best = max(present, key=lambda c: per[c]["tok_s_median"])
    theirs = per[best]["tok_s_median"]
    out: dict[str, Any] = {"of": best,
                           "median": round(per["gen_pipeline"]["tok_s_median"] / theirs, 3) if theirs else None}
    for key, figure in (("per_round", "tok_s"), ("per_round_log", "slots_log"), ("per_round_trace", "slots_trace")):
        paired = {}
        for rnd in sorted({r["round"] for r in rows}):
            this = {r["client"]: r.get(figure) for r in rows if r["round"] == rnd}
            theirs = [v for c, v in this.items() if c in present and v]
            if this.get("gen_pipeline") and theirs:
                paired[str(rnd)] = round(this["gen_pipeline"] / max(theirs), 3)
        out[key] = paired
        out[f"{key}_median"] = round(statistics.median(paired.values()), 3) if paired else None
    return out


def headline(summary: dict) -> dict:
    """Per regime, gen_pipeline over each of SGLang's clients and the better of them: medians of the whole
    runs, per-round medians, and per-round medians with the GPU's speed factored out (decode log)."""
    return {regime: {k: {"of": v["of"], "median": v["median"], "per_round_median": v["per_round_median"],
                         "gpu_factored_out_median": v["per_round_log_median"]}
                     for k, v in entry.items() if k.startswith("over_")}
            for regime, entry in summary.items()}
