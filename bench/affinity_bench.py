"""Conversation affinity (issue 24): where a multi-turn sample's later turns go, and what it is worth.

Four simulator processes at the seed profile's prefill and decode costs (sglang_sim/profiles.py "seed":
70 us per prefilled token, the calibrated decode step), each with its radix cache and a KV pool small
enough to be the limit, run `generate` (through the library, in this process: what the CLI calls) on a
B1/B6-like multi-turn dataset (3-5 user turns a sample, ~70-token user turns, ~200-token answers), four
ways: direct with `--routing affinity` (the default: a later turn goes back to its previous turn's
server, server/fleet.py), direct with `--routing free-kv` (every request to the most free KV), and
through the real sglang-router binary with its cache_aware and round_robin policies. Then a single-turn
dataset, affinity vs free-kv (nothing to keep together there: the cost of the bookkeeping).

Cache figures come from the simulators: /sim/stats "turns" (per finished chat request, first or later
turn: prompt and cached tokens, and whether a later turn found the previous turn's whole prompt cached:
its prefix hit), checked against /metrics `sglang:cached_tokens_total` (what SGLang 0.5.17 exports).
Throughput is on the simulators' clocks as in bench/fleet_scale.py: samples / the mean over the servers
of simulated seconds from the run's first request to that server's last response (a simulator starved
of CPU on this 2-core machine re-anchors, so the contention does not count). The simulators stay up for
the whole bench (caches flushed before each run, figures as deltas); one unmeasured warm-up run per
dataset whenever the dataset changes. Each repetition runs every mode once, back to back, in reversed
order every other repetition; ratios are taken within a repetition, then the median over repetitions.

    python -m bench affinity       (python -m bench.affinity_bench, defaults as `main` says)
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_scale import router

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # the library's source load, in this process
from bench.report import md_table, write_section
from sglang_sim.testing import SimProcess, start_sim

REPO = Path(__file__).resolve().parent.parent
SERVERS = 4
KV_TOKENS = 16_000  # per server: KV-bound (~20 conversations each): conversations wait for room, and a waiting
# sample's cached prefix can be evicted (at 30,000 and 240 samples: 98.6 % prefix hits, 1.087 x free-kv)
SIM = ["--sim-profile", "seed", "--sim-startup-s", "0", "--sim-output-spread", "0.5",
       "--enable-metrics", "--enable-cache-report", "--log-level", "warning"]
OUTPUT_MEAN = 200
MAX_NEW_TOKENS = 512
MODES = {"affinity": ("direct", "affinity"), "free-kv": ("direct", "free-kv"),
         "router cache_aware": ("router", "cache_aware"), "router round_robin": ("router", "round_robin")}
SINGLE_TURN_MODES = ("affinity", "free-kv")
WORDS = ("the of and to in is it that for on with as was at by an be this are or from have not but what all "
         "were when we there can more if about which their will one each so them some into time has look two "
         "write like see number way could people than first water been call who now find long down day did "
         "get come made may part over new sound take only little work know place year live back give most").split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "?"


def write_dataset(folder: Path, samples: int, multi_turn: bool, seed: int = 24) -> Path:
    """`samples` + 10 % conversations: multi-turn ones of 3-5 user turns (40-70 words each, with source
    answers the run replaces), or one user turn each."""
    rng = random.Random(seed)
    rows = []
    for i in range(int(samples * 1.1) + 10):
        turns = rng.randint(3, 5) if multi_turn else 1
        messages: list[dict[str, str]] = []
        for t in range(turns):
            messages.append({"role": "user", "content": f"[{i}.{t}] " + _text(rng, rng.randint(40, 70))})
            messages.append({"role": "assistant", "content": "A source answer that is regenerated."})
        rows.append({"id": f"c{i}", "messages": messages})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "C.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    toml = folder / "C.toml"
    toml.write_text(f'name = "C"\ntarget_samples = {samples}\n[source]\nfiles = ["C.jsonl"]\nschema = "messages"\n'
                    f'field = "messages"\nid_field = "id"\n[sampling]\nmax_new_tokens = {MAX_NEW_TOKENS}\n'
                    '[generation]\nrequest_timeout_s = 300\n')
    return toml


def _stats(sim: SimProcess) -> dict[str, Any]:
    return dict(httpx.get(sim.url + "/sim/stats", timeout=10).json())


def _metric_cached_tokens(sim: SimProcess) -> float:
    """`sglang:cached_tokens_total` summed over its labels (cache_source), as SGLang 0.5.17 exports it."""
    text = httpx.get(sim.url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "sglang:cached_tokens"
               for s in f.samples if s.name == "sglang:cached_tokens_total")


def _snapshot(sims: list[SimProcess]) -> list[dict[str, Any]]:
    out = []
    for sim in sims:
        st = _stats(sim)
        st["metric_cached_tokens"] = _metric_cached_tokens(sim)
        out.append(st)
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """One run's share of a simulator's cumulative figures."""
    keys = set(after["turns"]) | set(before["turns"])
    return {"turns": {k: after["turns"].get(k, 0) - before["turns"].get(k, 0) for k in keys},
            "counters": {k: v - before["counters"].get(k, 0) for k, v in after["counters"].items()},
            "requests_completed": after["requests_completed"] - before["requests_completed"],
            "metric_cached_tokens": after["metric_cached_tokens"] - before["metric_cached_tokens"]}


def _wait_first_request(sims: list[SimProcess], seen: list[int], out: list[float]) -> None:
    """Poll until a simulator has a request past `seen`, then put every simulator's clock in `out`."""
    deadline = time.monotonic() + 600
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            if any(client.get(s.url + "/sim/stats").json()["requests_seen"] > n
                   for s, n in zip(sims, seen, strict=True)):
                out.extend(client.get(s.url + "/sim/stats").json()["sim_time_s"] for s in sims)
                return
            time.sleep(0.02)


def generate(toml: Path, url: str, routing: str, out: Path, limit: int | None = None) -> Any:
    """`gen-pipeline generate --dataset toml --server-url url --routing routing --output-dir out`, in this
    process through the library (what the CLI calls): no interpreter start-up and imports per run, which
    took longer than the runs themselves on the busy 2-core machine."""
    from gen_pipeline import load_dataset_config, run_job, run_options
    opts, _ = run_options([cfg := load_dataset_config(toml)], output_root=out, server_urls=[url], routing=routing,
                          limit=limit)
    AFFINITY_LOG.clear()
    return anyio.run(run_job, [cfg], opts)


AFFINITY_LOG: list[tuple[int, int]] = []  # the run's journal line "affinity: N later turns went back ..., M moved"


class _AffinityLine(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if m := re.match(r"affinity: ([\d,]+) later turns went back .*?, ([\d,]+) moved", record.getMessage()):
            AFFINITY_LOG.append((int(m[1].replace(",", "")), int(m[2].replace(",", ""))))


_journal = logging.getLogger("gen_pipeline.journal")
_journal.addHandler(_AffinityLine())
_journal.setLevel(logging.INFO)  # unconfigured, the library's INFO records stop before any handler


def run_one(mode: str, toml: Path, samples: int, sims: list[SimProcess], work: Path) -> dict[str, Any]:
    """One run of the CLI over `sims` (kept between runs: their caches flushed first, figures as deltas)."""
    kind, how = MODES[mode]
    for sim in sims:  # every mode starts from empty caches
        httpx.post(sim.url + "/flush_cache", timeout=10).raise_for_status()
    with ExitStack() as stack:
        if kind == "direct":
            url = ",".join(s.url for s in sims)
        else:
            url = stack.enter_context(router(sims, work / f"router-{how}.log", how))
        out = work / f"out-{mode.replace(' ', '-')}-{toml.parent.name}"
        seen = [_stats(s)["requests_seen"] for s in sims]
        start = _snapshot(sims)
        before: list[float] = []
        first = threading.Thread(target=_wait_first_request, args=(sims, seen, before), daemon=True)
        first.start()  # the clocks start at the first request, not at the run's set-up
        started = time.monotonic()
        summary = generate(toml, url, how if kind == "direct" else "free-kv", out)
        wall_s = time.monotonic() - started
        first.join(10)
        if summary.exit_code != 0 or not before:
            raise RuntimeError(f"{mode} failed: exit code {summary.exit_code}, {summary.runs[0].line()}")
        end = _snapshot(sims)
    # each server from the run's first request to its own last response (not to the CLI's exit: its
    # shutdown is not the servers' work), the mean over the servers that ran something
    spans = [st["last_completed_sim_s"] - b for st, s0, b in zip(end, start, before, strict=True)
             if st["requests_completed"] > s0["requests_completed"]]
    sim_s = statistics.fmean(spans)
    deltas = [_delta(e, s) for e, s in zip(end, start, strict=True)]
    turns: dict[str, int] = {}
    for d in deltas:
        for k, v in d["turns"].items():
            turns[k] = turns.get(k, 0) + v
    sim_cached = turns.get("first_cached_tokens", 0) + turns.get("later_cached_tokens", 0)
    metric_cached = sum(d["metric_cached_tokens"] for d in deltas)
    if metric_cached != sim_cached:
        raise RuntimeError(f"{mode}: /metrics sglang:cached_tokens_total {metric_cached} != the requests' "
                           f"cached tokens {sim_cached}")
    later = turns.get("later_turns", 0)
    counters = [d["counters"] for d in deltas]
    return {
        "mode": mode, "samples": samples, "sim_s": round(sim_s, 2), "server_spans_s": [round(x, 2) for x in spans],
        "samples_per_sim_s": round(samples / sim_s, 3),
        "wall_s": round(wall_s, 1), "requests_per_server": [d["requests_completed"] for d in deltas],
        "later_turns": later,
        "later_cached_share": round(turns.get("later_cached_tokens", 0) / max(1, turns.get("later_prompt_tokens", 0)),
                                    3),
        "later_prefix_hit_share": round(turns.get("later_prefix_hits", 0) / later, 3) if later else None,
        "prefill_tokens_per_sample": round(sum(c["computed_prefill_tokens_total"] for c in counters) / samples, 1),
        "retractions": sum(c["num_retracted_requests_total"] for c in counters),
        # later turns the fleet sent back to their previous server / elsewhere (direct affinity only)
        "later_turns_moved": AFFINITY_LOG[-1][1] if AFFINITY_LOG and how == "affinity" else None,
    }


def _median(rows: list[dict[str, Any]], mode: str, data: str, key: str) -> float:
    return statistics.median(r[key] for r in rows if r["mode"] == mode and r["data"] == data)


def _ratios(rows: list[dict[str, Any]], data: str, mode: str) -> list[float]:
    """Per repetition: mode's samples/sim-s over free-kv's (the same repetition, back to back)."""
    out = []
    for rep in sorted({r["rep"] for r in rows}):
        of = {r["mode"]: r["samples_per_sim_s"] for r in rows if r["rep"] == rep and r["data"] == data}
        if mode in of and "free-kv" in of:
            out.append(of[mode] / of["free-kv"])
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    for data, modes in (("multi-turn", tuple(MODES)), ("single-turn", SINGLE_TURN_MODES)):
        for mode in modes:
            mine = [r for r in rows if r["mode"] == mode and r["data"] == data]
            if not mine:
                continue
            entry: dict[str, Any] = {"data": data, "mode": mode, "runs": len(mine)}
            for key in ("samples_per_sim_s", "later_cached_share", "later_prefix_hit_share",
                        "prefill_tokens_per_sample", "retractions", "later_turns_moved", "later_turns"):
                values = [r[key] for r in mine if r.get(key) is not None]
                entry[key] = round(statistics.median(values), 3) if values else None
            ratios = _ratios(rows, data, mode)
            entry["vs_free_kv"] = round(statistics.median(ratios), 3) if ratios else None
            entry["vs_free_kv_runs"] = [round(x, 3) for x in ratios]
            seen = [max(r["requests_per_server"]) * SERVERS / sum(r["requests_per_server"]) for r in mine]
            entry["busiest_vs_mean"] = round(statistics.median(seen), 3)
            table.append(entry)
    return table


def _moved(t: dict[str, Any]) -> str:
    """Later turns affinity sent elsewhere (median), as a share of the later turns."""
    moved, later = t.get("later_turns_moved"), t.get("later_turns")
    return "–" if moved is None or not later else f"{moved:g} ({100 * moved / later:.1f} %)"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


NOTES = """
Reading it: free-kv finds the previous prompt cached about half the time, not 1/N, because the server
that just ran a turn has just freed that turn's KV and is often the freest when the next turn is sent
(round_robin shows the 1/N). Affinity's misses at this KV size: a later turn moves when its server's free
KV is more than 25 % of its capacity below the best server's ("later turns moved"), or a waiting
conversation's cached prefix was evicted to make room (the rest of the misses). In the run of 2 Dec 2026,
2.6 % moved and ~6 % found their prefix evicted, so a wider margin would recover little: the rule stays at
25 % (an earlier run at 30,000 KV tokens, 240 samples, the CLI as a subprocess: 98.6 % prefix hits,
1.087 × free-kv). The gain is the prefill saved (~400 prefilled tokens a sample at
the seed profile's 70 µs a token, in steps every running request waits for). sglang-router's cache_aware keeps
the prefixes too and comes close; it is one more process and hop. Single-turn: the same choices as
free-kv (nothing to keep together); the spread is run-to-run noise on the busy machine.
"""


def _median_of(table: list[dict[str, Any]], data: str, mode: str, key: str) -> Any:
    return next((t[key] for t in table if t["data"] == data and t["mode"] == mode), None)


def verdicts(table: list[dict[str, Any]]) -> list[str]:
    """The issue's targets against the medians, met or missed."""
    hit = _median_of(table, "multi-turn", "affinity", "later_prefix_hit_share")
    free_hit = _median_of(table, "multi-turn", "free-kv", "later_prefix_hit_share")
    multi = _median_of(table, "multi-turn", "affinity", "vs_free_kv")
    single = _median_of(table, "single-turn", "affinity", "vs_free_kv")
    out = []
    if hit is not None:
        out.append(f"- later turns' prefix from cache under affinity ≥ 90 %: {_pct(hit)}, "
                   f"{'met' if hit >= 0.9 else 'MISSED'} (free-kv: {_pct(free_hit)}; 1/N = {_pct(1 / SERVERS)})")
    if multi is not None:
        out.append(f"- multi-turn throughput ≥ 1.05 × free-kv: {multi:.3f} ×, {'met' if multi >= 1.05 else 'MISSED'}")
    if single is not None:
        out.append(f"- single-turn throughput ≥ 0.97 × free-kv: {single:.3f} ×, "
                   f"{'met' if single >= 0.97 else 'MISSED'}")
    return out


def markdown(table: list[dict[str, Any]], args: argparse.Namespace, bench_s: float, load: float) -> str:
    rows = [[t["data"], t["mode"], t["runs"], t["samples_per_sim_s"], t["vs_free_kv"] or "–",
             " / ".join(map(str, t["vs_free_kv_runs"])) or "–", _pct(t["later_prefix_hit_share"]),
             _pct(t["later_cached_share"]), _moved(t), t["prefill_tokens_per_sample"], t["retractions"],
             t["busiest_vs_mean"]] for t in table]
    headers = ["data", "routing", "runs", "samples/sim-s (median)", "× free-kv (median)", "× free-kv per run",
               "later turns: prefix cached", "later turns: cached / prompt tokens", "later turns moved",
               "prefilled tokens / sample",
               "retractions", "busiest / mean"]
    command = (f"python -m bench.affinity_bench --repeats {args.repeats} --samples {args.samples} --single-samples "
               f"{args.single_samples} --time-scale {args.time_scale:g} --kv-tokens {args.kv_tokens} "
               f"--output-mean {args.output_mean}")
    return f"""## Conversation affinity: a sample's turns on one server (`python -m bench affinity`)

`python -m bench affinity` (= `{command}`; {bench_s:.0f} s of wall time, load average {load:.1f} on the 2
cores at the end): `generate` over {SERVERS} simulator processes (seed profile: its prefill and decode
costs; {args.kv_tokens:,} KV tokens each, the limit; radix cache on) and the real sglang-router binary.
Multi-turn data: {args.samples} samples of 3-5 user turns (40-70 words each; answers drawn at a mean of
{args.output_mean} tokens, max_new_tokens {MAX_NEW_TOKENS}), so turn k+1's prompt is turn k's prompt + answer + a
new question. Single-turn data: {args.single_samples} samples of one such question. Routings: `affinity`
(`--routing affinity`, the default: a later turn goes back to its previous turn's server while that one
is up and its free KV is within 25 % of its capacity of the best server's; else by free KV), `free-kv`
(`--routing free-kv`: every request to the most free KV), sglang-router's `cache_aware` (its default)
and `round_robin`. "prefix cached": the share of later turns (turn ≥ 2) whose whole previous-turn prompt
was a cache hit on the server that ran them (/sim/stats); "cached / prompt tokens": cached-prefix tokens
over the later turns' prompt tokens; the servers' `sglang:cached_tokens_total` equals the requests'
cached tokens in every run (checked). Throughput: samples / the mean over the servers of simulated
seconds from the run's first request to the server's last response. × free-kv: within each repetition
(modes back to back, the order reversed every other one), then the median over {args.repeats} repetitions.
"later turns moved": those affinity sent away from their previous turn's server (it was out, or past the
margin), from the run's journal line. "busiest / mean": the most requests one server ran over the mean.

{md_table(headers, rows)}

Targets (medians):
{chr(10).join(verdicts(table))}
{NOTES}"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.affinity_bench", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=120, help="multi-turn samples (default: %(default)s)")
    p.add_argument("--single-samples", type=int, default=400, help="single-turn samples (default: %(default)s)")
    p.add_argument("--time-scale", type=float, default=5.0, help="simulated seconds a second (default: %(default)s)")
    p.add_argument("--output-mean", type=int, default=OUTPUT_MEAN, help="answers' mean tokens (default: %(default)s)")
    p.add_argument("--kv-tokens", type=int, default=KV_TOKENS, help="each simulator's KV pool (default: %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    p.add_argument("--no-single-turn", action="store_true", help="skip the single-turn comparison")
    p.add_argument("--no-write", action="store_true", help="print only (no results.json / docs/measurements.md)")
    args = p.parse_args(argv or [])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: the ExitStack still stops the simulators
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bench_started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        multi = write_dataset(work / "multi", args.samples, multi_turn=True)
        single = write_dataset(work / "single", args.single_samples, multi_turn=False)
        sim_args = [*SIM, "--max-total-tokens", str(args.kv_tokens), "--time-scale", str(args.time_scale),
                    "--sim-output-mean", str(args.output_mean)]
        sims = [stack.enter_context(start_sim(sim_args, ready_timeout_s=60)) for _ in range(SERVERS)]
        for rep in range(args.repeats):
            order = modes if rep % 2 == 0 else modes[::-1]  # each mode first in some repetition
            plan = [("multi-turn", multi, m) for m in order]
            if not args.no_single_turn:
                plan += [("single-turn", single, m) for m in order if m in SINGLE_TURN_MODES]
            previous = None
            for data, toml, mode in plan:
                (work / f"rep{rep}").mkdir(exist_ok=True)
                if toml != previous:  # unmeasured warm-up: a cold first run measured 0.66 x, the first after a
                    # switch of dataset 0.8-0.9 x (the source's load competing with the client, it seems)
                    generate(toml, ",".join(s.url for s in sims), "free-kv", work / f"rep{rep}" / f"warm-{data}",
                             limit=4)
                    previous = toml
                n = args.samples if data == "multi-turn" else args.single_samples
                r = run_one(mode, toml, n, sims, work / f"rep{rep}")
                r.update(data=data, rep=rep)
                rows.append(r)
                print(f"[{rep + 1}/{args.repeats}] {data:11s} {mode:18s} {r['samples_per_sim_s']:7.3f} samples/sim-s, "
                      f"later turns: prefix cached {_pct(r['later_prefix_hit_share'])}, cached/prompt "
                      f"{_pct(r['later_cached_share'])}; {r['prefill_tokens_per_sample']:.0f} prefilled tokens/sample, "
                      f"{r['retractions']} retractions, requests {r['requests_per_server']}, {r['wall_s']:.0f} s wall",
                      flush=True)
    table = summarise(rows)
    bench_s, load = time.monotonic() - bench_started, os.getloadavg()[0]
    md = markdown(table, args, bench_s, load)
    if not args.no_write:
        write_section("affinity", {"summary": table, "runs": rows, "repeats": args.repeats, "samples": args.samples,
                                   "time_scale": args.time_scale, "servers": SERVERS, "kv_tokens": args.kv_tokens,
                                   "output_mean": args.output_mean, "single_samples": args.single_samples,
                                   "bench_wall_s": round(bench_s, 1), "load_average": round(load, 2),
                                   "verdicts": verdicts(table)}, md)
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
