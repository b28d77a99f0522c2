"""The orchestrator's own CPU per completed sample, against a simulator answering with ~zero latency.

The CLI runs as a real subprocess attached to a simulator (fast profile, time scale 1e6: no
simulated waiting, short outputs). CPU = user + system time of the CLI process from wait4().
A run also pays fixed costs (imports, `datasets` loading the file, start-up), so the figure that
matters is the marginal cost: (CPU of a long run − CPU of a short run) / (extra samples).
Target (issue 3): ≤ 1 ms per short sample, i.e. one process can feed 1,000+ samples/s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.report import md_table, write_section
from sglang_sim.testing import start_sim

REPO = Path(__file__).resolve().parent.parent
SIM_ARGS = ["--sim-profile", "fast", "--time-scale", "1000000", "--sim-output-mean", "24", "--sim-output-spread",
            "0.3", "--max-running-requests", "512", "--sim-startup-s", "0"]
SHORT, LONG, REPEATS = 400, 3000, 3


def short_dataset(folder: Path, target: int) -> Path:
    """A dataset of LONG one-line prompts (written once in `folder`) and its TOML for `target` samples."""
    data = folder / "short.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(
            orjson.dumps({"id": f"s{i}", "messages": [{"role": "user", "content": f"Say hi #{i}"}]}) + b"\n"
            for i in range(LONG)))
    toml = folder / f"short{target}.toml"
    toml.write_text(f'name = "short{target}"\ntarget_samples = {target}\n[source]\nfiles = ["short.jsonl"]\n'
                    'schema = "messages"\nfield = "messages"\nid_field = "id"\n[sampling]\nmax_new_tokens = 32\n'
                    '[generation]\nreasoning = "none"\nrequest_timeout_s = 60\n'
                    '[output]\nshard_max_samples = 2000\nfsync_every = 64\n')
    return toml


def cli_cpu(url: str, toml: Path, out: Path, *extra: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one CLI run from an empty output folder (`extra`: more flags)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "gen_pipeline", "generate", "--dataset", str(toml),
                             "--server-url", url, "--output-dir", str(out), "--progress", "quiet", *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"generate failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return usage.ru_utime + usage.ru_stime, time.monotonic() - started


def measure() -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gp-overhead-") as tmp, start_sim(SIM_ARGS) as sim:
        folder = Path(tmp)
        for rep in range(REPEATS):
            short = cli_cpu(sim.url, short_dataset(folder, SHORT), folder / f"out-s{rep}")
            long = cli_cpu(sim.url, short_dataset(folder, LONG), folder / f"out-l{rep}")
            rows.append({"cpu_short_s": short[0], "cpu_long_s": long[0], "wall_long_s": long[1],
                         "marginal_ms": 1000 * (long[0] - short[0]) / (LONG - SHORT),
                         "total_ms": 1000 * long[0] / LONG})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"samples_short": SHORT, "samples_long": LONG, "repeats": REPEATS, "runs": rows,
            "median_marginal_ms_per_sample": round(med["marginal_ms"], 3),
            "median_total_ms_per_sample": round(med["total_ms"], 3),
            "median_wall_long_s": round(med["wall_long_s"], 2),
            "target_ms_per_sample": 1.0, "pass": med["marginal_ms"] <= 1.0}


def main(argv: list[str] | None = None) -> None:
    r = measure()
    table = md_table(["figure", "median of 3"], [
        ["marginal CPU per sample (ms)", r["median_marginal_ms_per_sample"]],
        [f"total CPU per sample over {LONG} samples, start-up included (ms)", r["median_total_ms_per_sample"]],
        [f"wall time of the {LONG}-sample run (s)", r["median_wall_long_s"]],
        ["target (ms per sample)", "≤ 1.0 → " + ("PASS" if r["pass"] else "FAIL")],
    ])
    md = (f"## Orchestrator CPU per sample\n\n`python -m bench overhead`: the CLI attached to the simulator "
          f"answering with ~zero latency (fast profile, time scale 1e6, ~24-token outputs); CPU from wait4() of the "
          f"CLI process; marginal = (CPU of a {LONG}-sample run − CPU of a {SHORT}-sample run) / {LONG - SHORT}.\n\n"
          + table)
    print(md)
    write_section("overhead", r, md)


if __name__ == "__main__":
    main()
