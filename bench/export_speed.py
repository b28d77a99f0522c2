"""Export speed (issue 12): `gen-pipeline export` of the 88,000-sample reference job must take < 60 s.

Synthesizes B1, B2, B6, B7 at their targets through the real DatasetStore (the shapes of the
README's dataset table: B2 long reasoning, B6 multi-turn), once, in the temp dir (reused by later
runs), then times the CLI as a user runs it, one fresh process per format (interpreter start and
the `datasets` import included), with a 2% validation split. Run: `python -m bench.export_speed`.

The `tokens` format two ways: from the server's token ids (a second copy of the datasets whose
assistant turns carry prompt_token_ids / token_ids of the lengths in PROFILES, as a run recording
them would write), and rendered with an offline tokenizer (bench/chat_templates.py, Qwen3-style
template, its BPE trained on the benchmark's own words): every assistant turn rendered twice by the
template (its prompt, and the conversation up to it) and tokenized (gen_pipeline/export/tokens.py,
encode.py, direct.py say how that is fast and exact).

`--repeat N` (default 3) runs each case N times, interleaved (case after case, then again), and
reports the median wall and CPU time (the runs' CPU times are in results.json).
"""

from __future__ import annotations

import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import md_table, write_section
from gen_pipeline.records import Sample
from gen_pipeline.store.dataset_store import DatasetStore

ROOT = Path(tempfile.gettempdir()) / "gen_pipeline_bench_export"
ROOT_IDS = Path(tempfile.gettempdir()) / "gen_pipeline_bench_export_ids"  # the same samples + server token ids
TOKENIZER = ROOT / "tokenizer-qwen3"
# ~2.5 characters a token on the benchmark's random words (measured, printed with the results): more
# tokens than a real tokenizer's ~4 characters a token on real text, so the rendered case errs slow.
TOKENIZER_VOCAB = 4_000
CHARS_PER_TOKEN = 4
# name: (samples, user turns, prompt tokens, completion tokens per turn, reasoning tokens per turn)
PROFILES = {"B1": (30_000, 2, 110, 240, 0), "B2": (18_000, 1, 700, 400, 2_800),
            "B6": (20_000, 3, 95, 220, 0), "B7": (20_000, 1, 90, 530, 0)}
TARGET_S = 60.0
CASES = {  # label: export flags after --format
    "specforge": ["specforge"],
    "specforge --expand-turns": ["specforge", "--expand-turns"],
    "specforge --mix (4 datasets, shares)": ["specforge", "--mix", "B1=0.3,B2=0.2,B6=0.25,B7=0.25"],
    "speculators": ["speculators"],
    "hf (save_to_disk)": ["hf"],
    "hf --hf-layout parquet": ["hf", "--hf-layout", "parquet"],
    "tokens (server token ids)": ["tokens"],
    "tokens (rendered: offline tokenizer + template)": ["tokens", "--tokenizer", str(TOKENIZER)],
}
# run in a fresh process: the CLI's main, then this process's peak RSS on stderr
RUNNER = ("import resource, sys; from gen_pipeline.cli import main; rc = main(sys.argv[1:]); "
          "u = resource.getrusage(resource.RUSAGE_SELF); "
          "print('maxrss_kb', u.ru_maxrss, 'cpu_s', u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(rc)")


class _Text:
    """Random word text sliced out of one pre-built blob (fast: 88K samples, ~0.5 GB)."""

    def __init__(self, rng: random.Random):
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5_000)]
        self.blob = " ".join(rng.choices(words, k=400_000))
        self.rng = rng

    def __call__(self, tokens: int) -> str:
        n = max(8, int(tokens * CHARS_PER_TOKEN * self.rng.uniform(0.5, 1.5)))
        start = self.rng.randrange(0, len(self.blob) - n)
        return self.blob[start:start + n]


class _Ids:
    """Token id lists sliced out of one pre-built random list (what a run recording ids would write)."""

    def __init__(self, rng: random.Random):
        self.blob = [rng.randrange(150_000) for _ in range(2_000_000)]
        self.rng = rng

    def __call__(self, n: int) -> list[int]:
        start = self.rng.randrange(0, len(self.blob) - n)
        return self.blob[start:start + n]


def _sample(name: str, i: int, text: _Text, ids: _Ids | None = None) -> Sample:
    _, turns, prompt, completion, reasoning = PROFILES[name]
    convs: list[dict[str, Any]] = [{"role": "system", "content": text(30)}] if i % 5 == 0 else []
    turns = 1 + i % turns if name == "B1" else turns  # ShareGPT: some chats go on
    history = 30 if convs else 0
    for _ in range(turns):
        convs.append({"role": "user", "content": text(prompt)})
        reply: dict[str, Any] = {"role": "assistant", "content": text(completion)}
        if reasoning:
            reply["reasoning_content"] = text(reasoning)
        if ids is not None:  # the prompt holds the history (its reasoning dropped, as Qwen3/Kimi templates do)
            history += prompt
            reply["prompt_token_ids"], reply["token_ids"] = ids(history), ids(completion + reasoning)
            history += completion
        convs.append(reply)
    meta = {"model": "moonshotai/Kimi-K2.5", "backend": "sglang", "finish_reason": "length" if i % 50 == 0 else "stop",
            "prompt_tokens": prompt * turns, "completion_tokens": (completion + reasoning) * turns, "turns": turns,
            "sampling": {"max_new_tokens": 8192 if reasoning else 2048, "temperature": 0.6, "top_p": 0.95},
            "kv_cache_dtype": "fp8_e4m3", "generated_at": "2026-12-01T12:00:00+00:00"}
    return Sample(f"{name}-{i:08x}", name, convs, meta)


def build() -> float:
    """Write the four dataset folders (twice: without and with server token ids) and the offline
    tokenizer unless a previous run left them; returns seconds spent."""
    t0 = time.perf_counter()
    for root, ids in ((ROOT, None), (ROOT_IDS, _Ids(random.Random(1)))):
        text = _Text(random.Random(0))
        for name, (samples, *_) in PROFILES.items():
            with DatasetStore(root, name, fingerprint={"model": "bench", "dataset": name}, target=samples,
                              shard_max_samples=2_000, fsync_every=2_000) as store:
                i = store.open().done
                while store.remaining:
                    store.write_samples([_sample(name, i + k, text, ids) for k in range(1_000)])
                    i += 1_000
    if not (TOKENIZER / "tokenizer.json").is_file():
        from bench.chat_templates import build_tokenizer

        words = _Text(random.Random(0)).blob.split(" ")
        corpus = [" ".join(words[j:j + 200]) for j in range(0, 200_000, 200)]
        build_tokenizer(TOKENIZER, "qwen3", corpus=corpus, vocab_size=TOKENIZER_VOCAB)
    return time.perf_counter() - t0


def time_case(flags: list[str], out: Path, root: Path = ROOT) -> dict:
    args = [sys.executable, "-c", RUNNER, "export", "--output-dir", str(root), "--out", str(out), "--force",
            "--val-share", "0.02", "--format", *flags]
    if "--mix" not in flags:
        args += [a for d in PROFILES for a in ("--dataset", d)]
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"export failed ({r.returncode}): {r.stderr}")
    rows = int(re.match(r"exported ([\d,]+) rows", r.stdout).group(1).replace(",", ""))
    size = sum(p.stat().st_size for p in ([out] if out.is_file() else out.rglob("*")) if p.is_file())
    if out.suffix == ".jsonl":
        size += out.with_name(out.stem + ".val.ndjson").stat().st_size
    usage = re.search(r"maxrss_kb (\d+) cpu_s ([\d.]+)", r.stderr)
    rss_kb, cpu_s = int(usage.group(1)), float(usage.group(2))
    return {"rows": rows, "wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2), "out_mb": round(size / 1e6, 1),
            "peak_rss_mb": rss_kb // 1024, "summary": r.stdout.strip()}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's runs: the median wall and CPU time, peak RSS at its most, the CPU time of each run."""
    out = dict(runs[0])
    out["wall_s"] = round(statistics.median(r["wall_s"] for r in runs), 2)
    out["cpu_s"] = round(statistics.median(r["cpu_s"] for r in runs), 2)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    out["cpu_s_runs"] = [r["cpu_s"] for r in runs]
    out["runs"] = len(runs)
    return out


def _chars_per_token() -> float:
    """Characters per token of the offline tokenizer on the benchmark's text."""
    from gen_pipeline.export.render import load_renderer

    sample = _Text(random.Random(5))(50_000)
    return len(sample) / len(load_renderer(str(TOKENIZER)).encode(sample))


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="export speed of the 88,000-sample reference job")
    p.add_argument("--only", action="append", help="run only the cases whose label starts with this (repeatable)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each case; the table shows medians (default 3)")
    args = p.parse_args(argv)
    build_s = build()
    disk_mb = sum(p.stat().st_size for p in ROOT.rglob("shard-*.jsonl")) / 1e6
    ids_mb = sum(p.stat().st_size for p in ROOT_IDS.rglob("shard-*.jsonl")) / 1e6
    samples = sum(p[0] for p in PROFILES.values())
    runs: dict[str, list[dict[str, Any]]] = {}
    cases = {k: v for k, v in CASES.items() if not args.only or any(k.startswith(o) for o in args.only)}
    with tempfile.TemporaryDirectory(prefix="export-bench-") as tmp:
        for _ in range(max(1, args.repeat)):
            for label, flags in cases.items():
                out = Path(tmp) / ("out.jsonl" if flags[0] != "hf" else "out")
                root = ROOT_IDS if label == "tokens (server token ids)" else ROOT
                runs.setdefault(label, []).append(time_case(flags, out, root))
                print(f"{label}: {runs[label][-1]['wall_s']} s wall, {runs[label][-1]['cpu_s']} s CPU", flush=True)
    results = {label: _median(r) for label, r in runs.items()}
    slowest = max(r["cpu_s"] for r in results.values())
    load = round(os.getloadavg()[0], 1)
    cpt = round(_chars_per_token(), 2)
    data = {"samples": samples, "shards_mb": round(disk_mb, 1), "shards_with_ids_mb": round(ids_mb, 1),
            "tokenizer_chars_per_token": cpt, "cases": results, "target_s": TARGET_S,
            "passed": slowest < TARGET_S, "build_s": round(build_s, 1), "cpus": os.cpu_count(), "load_avg_1m": load,
            "repeat": max(1, args.repeat),
            "command": "python -m bench.export_speed" + "".join(f" --only {o!r}" for o in args.only or [])
            + (f" --repeat {args.repeat}" if args.repeat != 3 else "")}
    rows = [[label, f"{r['rows']:,}", f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s", f"{r['out_mb']:,} MB",
             f"{r['peak_rss_mb']:,} MB"]
            for label, r in results.items()]
    reps = max(1, args.repeat)
    md = (f"## Export speed (`{data['command']}`)\n\n"
          f"`gen-pipeline export` of the reference job's {samples:,} samples (B1, B2, B6, B7 written through the "
          f"store: {disk_mb:,.0f} MB of shards, B2 with ~11 KB of reasoning a sample, B6 three turns), "
          "`--val-share 0.02`, one fresh CLI process each (start-up and the `datasets` import included), "
          f"warm page cache, {os.cpu_count()} CPUs shared with other work (load average {load} at the end); "
          f"{'the median of ' + str(reps) + ' runs of each case, interleaved' if reps > 1 else 'one run each'}. "
          f"Target: every case under {TARGET_S:.0f} s of CPU time (user + sys of the export process, threads "
          "included), which the load does not inflate as it does wall time (mostly waiting for a core here). "
          "The rows are held in memory (peak RSS below) to shuffle and split. "
          f"`tokens (server token ids)` reads a copy of the datasets whose turns carry prompt_token_ids / token_ids "
          f"({ids_mb:,.0f} MB of shards); `tokens (rendered)` renders every turn with the Qwen3-style template and "
          f"tokenizes it with an offline byte-level BPE ({TOKENIZER_VOCAB:,} tokens, {cpt} characters a token on "
          "this text).\n\n"
          + md_table(["export", "rows written", "wall time", "CPU time", "output", "peak RSS"], rows))
    write_section("export_speed", data, md)
    print(md)


if __name__ == "__main__":
    main()
