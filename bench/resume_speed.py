"""Resume speed (issue 3): DatasetStore.open() on a folder holding 88,000 samples must take < 2 s.

Builds the folder once in the temp dir (reused by later runs), then times open() (lock, drift
check, repair, done-id scan: sealed shards through their sidecars, the open shard parsed) as the
median of 5, and `status` on the same folder. Run: `python -m bench.resume_speed`.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import md_table, write_section
from gen_pipeline.records import Sample
from gen_pipeline.reports.status import read_status
from gen_pipeline.store.dataset_store import DatasetStore

SAMPLES = 88_000
SHARD_MAX_SAMPLES = 1_500  # 58 sealed shards + an open one with 1,000 lines to parse
LINE_CHARS = 3_000  # realistic short-to-medium samples; B2's ~16 KB lines would need ~1.4 GB here
REPEATS = 5
FINGERPRINT = {"model": "bench", "sampling": {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 4096}}
ROOT = Path(tempfile.gettempdir()) / "gen_pipeline_bench_resume"
_WORDS = "the of and to in is that for it as with was on be by this are from at or an".split()


def _sample(i: int, rng: random.Random) -> Sample:
    text = " ".join(rng.choices(_WORDS, k=LINE_CHARS // 4))[: LINE_CHARS - 200]
    return Sample(f"B2-{i:08x}", "B2",
                  [{"role": "user", "content": text[:150]}, {"role": "assistant", "content": text}],
                  {"model": "bench", "backend": "sim", "finish_reason": "stop", "prompt_tokens": 40,
                   "completion_tokens": len(text) // 4, "turns": 1})


def _store() -> DatasetStore:
    return DatasetStore(ROOT, "B2", fingerprint=FINGERPRINT, target=SAMPLES,
                        shard_max_samples=SHARD_MAX_SAMPLES, fsync_every=5_000)


def build() -> float:
    """Write the 88,000-sample folder unless a previous run left it; returns seconds spent."""
    t0 = time.perf_counter()
    with _store() as store:
        state = store.open()
        rng = random.Random(0)
        i = state.done
        while store.remaining:
            store.write_samples([_sample(i + k, rng) for k in range(1_000)])
            i += 1_000
    return time.perf_counter() - t0


def time_open() -> tuple[list[float], int]:
    """Seconds per open() (each followed by close()) and the done count it found."""
    times, done = [], 0
    for _ in range(REPEATS):
        store = _store()
        t0 = time.perf_counter()
        done = store.open().done
        times.append(time.perf_counter() - t0)
        store.close()
    return times, done


def main() -> None:
    build_s = build()
    times, done = time_open()
    t0 = time.perf_counter()
    status = read_status(ROOT, "B2", SAMPLES)
    status_s = time.perf_counter() - t0
    folder = ROOT / "B2"
    disk_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
    open_s = statistics.median(times)
    data = {"samples_on_disk": done, "shards": status.shards, "shard_max_samples": SHARD_MAX_SAMPLES,
            "line_bytes": round(disk_mb * 1e6 / max(done, 1)), "disk_mb": round(disk_mb, 1),
            "open_median_s": round(open_s, 4), "open_max_s": round(max(times), 4), "repeats": REPEATS,
            "status_s": round(status_s, 4), "target_s": 2.0, "passed": open_s < 2.0,
            "build_s": round(build_s, 1), "cpus": os.cpu_count(), "command": "python -m bench.resume_speed"}
    md = ("## Resume speed (`python -m bench.resume_speed`)\n\n"
          f"`DatasetStore.open()` on a folder with {done:,} samples ({status.shards} shards of {SHARD_MAX_SAMPLES:,}, "
          f"~{data['line_bytes']:,} B a line, {data['disk_mb']} MB; warm page cache), median of {REPEATS}. "
          "Sealed shards are read through their id sidecars; only the open shard is parsed.\n\n"
          + md_table(["samples on disk", "open() median", "open() max", "status", "target"],
                     [[f"{done:,}", f"{open_s * 1000:.0f} ms", f"{max(times) * 1000:.0f} ms",
                       f"{status_s * 1000:.0f} ms", "< 2 s"]]))
    write_section("resume_speed", data, md)
    print(md)


if __name__ == "__main__":
    main()
