"""Rebuild docs/report.png and the diagnose output in docs/status.md: B2 at bf16 KV on the simulator.

The seed-calibrated simulator at the baseline flags (bf16 KV at mem_fraction_static 0.85: 116K KV
tokens), the bundled demo prompts with B2-like ~4K-token outputs, a fixed 150 in flight as the seed
ran; two runs (a --limit, then the resume) so the plot shows a run boundary.

    .venv/bin/python docs/make_report_png.py        # ~2 min; prints the diagnosis
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = """
[profile.sim-seed-b2]
inherits = "sim-seed"
mem_fraction_static = 0.85
kv_cache_dtype = "bf16"
enable_hierarchical_cache = false
hicache_size_gb = 0
extra_args = ["--sim-profile", "seed", "--time-scale", "200", "--sim-startup-s", "0.5",
              "--sim-output-mean", "4000", "--sim-output-spread", "0.25"]
"""


def cli(*args: str | Path) -> str:
    r = subprocess.run([sys.executable, "-m", "gen_pipeline", *map(str, args)], cwd=REPO, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(r.stdout + r.stderr)
    return r.stdout


def main() -> None:
    from gen_pipeline.reports.page import plot_png
    from gen_pipeline.store.telemetry import read_telemetry

    work = Path(tempfile.mkdtemp(prefix="seed-b2-"))
    cfg, out = work / "cfg", work / "out"
    cfg.mkdir()
    shutil.copy(REPO / "datasets_cfg" / "server.toml", cfg / "server.toml")
    with open(cfg / "server.toml", "a") as f:
        f.write(PROFILE)
    (cfg / "data").mkdir()
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Prove lemma {i}: the sum of the first {i} "
                                                                        "odd numbers is a square."}]}
            for i in range(1200)]
    (cfg / "data" / "b2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    toml = (REPO / "datasets_cfg" / "demo.toml").read_text()
    toml = toml.replace('name = "demo"', 'name = "B2"').replace("max_new_tokens = 512", "max_new_tokens = 8192")
    toml = toml.replace("data/demo.jsonl", "data/b2.jsonl")
    toml = toml.replace("shard_max_samples = 100", "shard_max_samples = 500")
    (cfg / "B2.toml").write_text(toml.replace("target_samples = 240", "target_samples = 1000"))
    gen = ("generate", "--dataset", "B2", "--config-dir", cfg, "--output-dir", out, "--server", "sim-seed-b2",
           "--window", "150", "--progress", "quiet", "--poll-interval-s", "0.5")
    cli(*gen, "--limit", "500")
    cli(*gen)
    print(cli("diagnose", "--dataset", "B2", "--output-dir", out, "--config-dir", cfg), end="")
    png = plot_png(read_telemetry(out / "B2"),
                   "B2 on the simulator calibrated to the reference node: bf16 KV, 116K tokens, 150 in flight", dpi=60)
    (REPO / "docs" / "report.png").write_bytes(png)
    page = cli("report", "--dataset", "B2", "--output-dir", out, "--config-dir", cfg).strip()
    print(f"docs/report.png: {len(png):,} bytes; the whole report: {page}")


if __name__ == "__main__":
    main()
