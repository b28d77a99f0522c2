"""The streaming client's CPU per 1K completion tokens (issue 34, part 2: a client that never binds).

On an H200 the generate process took 42-48 ms of CPU per 1K tokens streamed at SGLang's
`--stream-interval 8` and 108-129 ms at interval 1 (docs/measurements.md, "Short outputs past SGLang's
CUDA-graph ceiling"): one core follows ~20K tok/s, where an 8B target on 8 GPUs makes 50-100K.
Goal: <= 10 ms per 1K tokens at interval 8, <= 25 ms at interval 1.

Here: the CLI as a real subprocess against two simulators at time scale 1 (paced: each event mostly arrives
alone, as from a GPU; at time scale 1e6 several share a read and the figures drop to 12 / 28 ms), one at
each stream interval, outputs of the H200 short regime (a few hundred tokens, max_new_tokens 512),
a fixed window. CPU = user + system time of the CLI process from wait4() (the simulator's is not counted).
A run also pays fixed costs (imports, start-up, per-request work), so the figure is the marginal one:
(CPU of a LONG-request run − CPU of a SHORT-request run) / (their difference in completion tokens, read
from the samples written). Variants alternate run by run; medians are reported. Whole answers
(`on_loop = "off"`: one JSON body a turn, no loop detector) are the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.gpu.regimes import readers_cpu
from bench.overhead import cli_cpu
from bench.report import RESULTS_JSON, md_table, write_section
from sglang_sim.testing import start_sim

TIME_SCALE = "1"
MAX_NEW_TOKENS, OUTPUT_MEAN, OUTPUT_SPREAD = 512, 300, 0.5  # the H200 short regime: max 512, a few hundred
SIM_ARGS = ["--sim-profile", "fast", "--time-scale", TIME_SCALE, "--sim-output-mean", str(OUTPUT_MEAN),
            "--sim-output-spread", str(OUTPUT_SPREAD), "--max-running-requests", "512", "--sim-startup-s", "0"]
WINDOW, SHORT, LONG, REPEATS = 32, 30, 150, 5
# (name, stream interval of the simulator it runs against, mode, reader processes); whole answers do not depend
# on the interval
VARIANTS = (("streamed-8", 8, "streamed", 0), ("streamed-1", 1, "streamed", 0), ("whole", 8, "whole", 0),
            ("streamed-8, 2 readers", 8, "streamed", 2), ("streamed-1, 2 readers", 1, "streamed", 2))
GOALS_MS = {"streamed-8": 10.0, "streamed-1": 25.0}  # issue 34's goals per 1K tokens
GOALS_MS.update({f"{k}, 2 readers": v for k, v in list(GOALS_MS.items())})  # ... of the main process
H200_MS = {"streamed-8": "42-48", "streamed-1": "108-129"}  # the figures (docs/measurements.md)
# one H100, the small model, ~28K tok/s at interval 8 and ~12K at 1 (sections gpu_h100_readers_small(_i1)): main
# process / all, as shipped (3 readers started as the run went) and with --readers 0
H100_MS = {"streamed-8": "33.3 (--readers 0)", "streamed-8, 2 readers": "10.3 / 44.9 (3 readers, as shipped)",
           "streamed-1, 2 readers": "17.6 / 98.1 (3 readers, as shipped)"}


def dataset(folder: Path, target: int, mode: str) -> Path:
    """A dataset TOML of `target` one-line prompts (the prompts written once in `folder`), answers of up to
    MAX_NEW_TOKENS; mode "whole": `on_loop = "off"` (turns come as one JSON answer, no loop detector)."""
    data = folder / "prompts.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(
            orjson.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Tell a story #{i}"}]}) + b"\n"
            for i in range(max(LONG, target))))
    name = f"c{target}-{mode}"
    toml = folder / f"{name}.toml"
    toml.write_text(f'name = "{name}"\ntarget_samples = {target}\n[source]\nfiles = ["prompts.jsonl"]\n'
                    'schema = "messages"\nfield = "messages"\nid_field = "id"\n'
                    f'[sampling]\nmax_new_tokens = {MAX_NEW_TOKENS}\n'
                    '[generation]\nreasoning = "none"\nrequest_timeout_s = 120\n'
                    + ('on_loop = "off"\n' if mode == "whole" else "")
                    + '[output]\nshard_max_samples = 5000\nfsync_every = 64\n')
    return toml


def tokens_written(out: Path) -> int:
    """Completion tokens the run streamed: those of the samples written, and those of attempts discarded."""
    total = 0
    for shard in out.glob("*/shard-*.jsonl"):
        for line in shard.read_bytes().splitlines():
            for turn in orjson.loads(line)["meta"]["per_turn"]:
                total += turn["completion_tokens"] + turn["discarded_tokens"]
    return total


def _run(url: str, folder: Path, target: int, mode: str, tag: str, readers: int = 0) -> tuple[float, float, int, float]:
    """(CPU of the run, wall, tokens, CPU of its main process): with readers, the main process's CPU is the run's
    less what its readers said they used (run.log); without, the two are one."""
    out = folder / f"out-{tag}"
    cpu, wall = cli_cpu(url, dataset(folder, target, mode), out, "--window", str(WINDOW), "--readers", str(readers))
    main = cpu
    if readers:
        said = readers_cpu(next(out.glob("*/run.log")))
        assert said is not None, f"no reader CPU line in {out}"
        main = cpu - said[2]
    return cpu, wall, tokens_written(out), main


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one variant's runs."""
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)
    marginal = med("marginal_ms_per_1k")
    # a marginal at or below 0 is the machine's noise, not a client that costs nothing: no rate from it
    return {"runs": runs, "median_marginal_ms_per_1k_tokens": round(marginal, 2),
            "median_main_marginal_ms_per_1k_tokens": round(med("main_marginal_ms_per_1k"), 2),
            "median_total_ms_per_1k_tokens": round(med("total_ms_per_1k"), 2),
            "median_tokens_long": round(med("tokens_long")),
            "median_tokens_per_cpu_s": round(1e6 / marginal) if marginal > 0 else None,
            "median_wall_long_s": round(med("wall_long_s"), 2)}


def measure(repeats: int = REPEATS, short: int = SHORT, long: int = LONG) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _, _ in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="gp-client-cpu-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        sims = {interval: stack.enter_context(start_sim([*SIM_ARGS, "--stream-interval", str(interval)]))
                for interval in sorted({i for _, i, _, _ in VARIANTS})}
        for name, interval, mode, readers in VARIANTS:  # warm-up: the page cache, the sims' first requests
            _run(sims[interval].url, folder, short, mode, f"warm-{name}", readers)
        for rep in range(repeats):
            for name, interval, mode, readers in VARIANTS:  # alternating: every variant sees the same load
                url, tag = sims[interval].url, name.replace(", ", "-").replace(" ", "")
                s_cpu, _, s_tok, s_main = _run(url, folder, short, mode, f"{tag}-s{rep}", readers)
                l_cpu, l_wall, l_tok, l_main = _run(url, folder, long, mode, f"{tag}-l{rep}", readers)
                rows[name].append({"cpu_short_s": round(s_cpu, 3), "cpu_long_s": round(l_cpu, 3),
                                   "main_short_s": round(s_main, 3), "main_long_s": round(l_main, 3),
                                   "tokens_short": s_tok, "tokens_long": l_tok, "wall_long_s": round(l_wall, 2),
                                   "marginal_ms_per_1k": 1e6 * (l_cpu - s_cpu) / max(1, l_tok - s_tok),
                                   "main_marginal_ms_per_1k": 1e6 * (l_main - s_main) / max(1, l_tok - s_tok),
                                   "total_ms_per_1k": 1e6 * l_cpu / max(1, l_tok)})
    out: dict[str, Any] = {"window": WINDOW, "requests_short": short, "requests_long": long, "repeats": repeats,
                           "max_new_tokens": MAX_NEW_TOKENS, "output_mean": OUTPUT_MEAN,
                           "goals_ms_per_1k_tokens": GOALS_MS}
    for name, _, _, _ in VARIANTS:
        out[name] = summarise(rows[name])
        if name in GOALS_MS:  # the main process's: one core binds the run, readers spread over the others
            out[name]["pass"] = out[name]["median_main_marginal_ms_per_1k_tokens"] <= GOALS_MS[name]
    return out


def render(r: dict[str, Any]) -> str:
    names = [name for name, _, _, _ in VARIANTS]
    def main_rate(n: str) -> Any:
        ms = r[n]["median_main_marginal_ms_per_1k_tokens"]
        return round(1e6 / ms) if ms > 0 else "– (marginal ≤ 0: noise)"
    table = md_table([f"figure (median of {r['repeats']})", "streamed, interval 8", "streamed, interval 1",
                      "whole (on_loop = \"off\")", "interval 8, 2 readers", "interval 1, 2 readers"], [
        ["marginal CPU per 1K completion tokens, main process (ms)",
         *[r[n]["median_main_marginal_ms_per_1k_tokens"] for n in names]],
        ["marginal CPU per 1K completion tokens, main process + readers (ms)",
         *[r[n]["median_marginal_ms_per_1k_tokens"] for n in names]],
        ["client CPU per 1K tokens, start-up included (ms)", *[r[n]["median_total_ms_per_1k_tokens"] for n in names]],
        ["tokens the main process's core follows (marginal, tok/s)", *[main_rate(n) for n in names]],
        [f"completion tokens of the {r['requests_long']}-request run", *[r[n]["median_tokens_long"] for n in names]],
        ["goal (ms per 1K, main process)", *[f"≤ {GOALS_MS[n]:g}: " + ("PASS" if r[n]["pass"] else "FAIL")
                                             if n in GOALS_MS else "–" for n in names]],
        ["on the H200 (real SGLang, ms per 1K)", *[H200_MS.get(n, "–") for n in names]],
        ["on one H100, small model (real SGLang; main / all, ms per 1K)", *[H100_MS.get(n, "–") for n in names]],
    ])
    return (f"## Client CPU per 1K streamed tokens\n\n`python -m bench client_cpu`: the CLI attached to two "
            f"simulators, paced (`{' '.join(SIM_ARGS)}`, `--stream-interval` 8 and 1), fixed "
            f"window {r['window']}, one-turn samples of `max_new_tokens = {r['max_new_tokens']}` (~{r['output_mean']}-"
            "token answers, the H200 short regime); CPU of the client from wait4() (the simulators' not counted; "
            "with `--readers 2`, the reader processes' too, and the main process's alone is that less the readers' "
            "CPU as their last frames said it, from run.log); marginal = (CPU of a "
            f"{r['requests_long']}-request run − CPU of a {r['requests_short']}-"
            "request run) / their difference in completion tokens written. Streamed = the default (SSE, the loop "
            "detector reading the text every 16 tokens); whole = `[generation] on_loop = \"off\"` (one JSON answer a "
            "turn); the first three read in the main process (`--readers 0`). The goal is the main process's: its one "
            "core binds the run, where readers spread over the others. Variants alternate run by run. On a shared "
            "machine the simulator's pacing wavers with the load (a late simulator writes several events at once: a "
            "cheaper read), interval 1 most: runs of one variant spread ±20 %; `python -m bench.stream_replay` "
            "measures the streamed path alone against a replay server that costs ~nothing, for A/B work.\n\n"
            + table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.client_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--no-write", action="store_true", help="print the table only (no results.json/docs)")
    ap.add_argument("--from-results", action="store_true", help="render the section from bench/results.json")
    args = ap.parse_args(argv)
    r = orjson.loads(RESULTS_JSON.read_bytes())["client_cpu"] if args.from_results else measure(args.repeats)
    md = render(r)
    print(md)
    if not args.no_write:
        write_section("client_cpu", r, md)


if __name__ == "__main__":
    main()
