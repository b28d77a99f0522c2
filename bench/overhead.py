"""The orchestrator's own CPU per completed sample, against a simulator answering with ~zero latency.

The CLI runs as a real subprocess attached to a simulator (fast profile, time scale 1e6: no
simulated waiting, short outputs). CPU = user + system time of the CLI process from wait4().
A run also pays fixed costs (imports, `datasets` loading the file, start-up), so the figure that
matters is the marginal cost: (CPU of a long run − CPU of a short run) / (extra samples).
Target (issue 3): ≤ 1 ms per short sample, i.e. one process can feed 1,000+ samples/s.
Both ways a turn travels (issue 22): streamed (the default: SSE chunks fed to the loop detector)
and whole (`[generation] on_loop = "off"`: one JSON answer, no detector), runs alternating.
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
# How a turn comes back: streamed (the default while the loop gate is on) or whole (on_loop = "off")
MODES = ("streamed", "whole")


def short_dataset(folder: Path, target: int, mode: str = "streamed") -> Path:
    """A dataset of LONG one-line prompts (written once in `folder`) and its TOML for `target` samples;
    mode "whole": `on_loop = "off"` (no loop detector, so turns come as one JSON answer)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    data = folder / "short.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(
            orjson.dumps({"id": f"s{i}", "messages": [{"role": "user", "content": f"Say hi #{i}"}]}) + b"\n"
            for i in range(LONG)))
    name = f"short{target}" + ("-whole" if mode == "whole" else "")
    toml = folder / f"{name}.toml"
    toml.write_text(f'name = "{name}"\ntarget_samples = {target}\n[source]\nfiles = ["short.jsonl"]\n'
                    'schema = "messages"\nfield = "messages"\nid_field = "id"\n[sampling]\nmax_new_tokens = 32\n'
                    '[generation]\nreasoning = "none"\nrequest_timeout_s = 60\n'
                    + ('on_loop = "off"\n' if mode == "whole" else "")
                    + '[output]\nshard_max_samples = 2000\nfsync_every = 64\n')
    return toml


def cli_cpu(url: str, toml: Path, out: Path, *extra: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one CLI run from an empty output folder (`extra`: more flags; answers read
    in the main process unless they say --readers, so that figures compare across runs: wait4() counts the
    readers' CPU too)."""
    started = time.monotonic()
    extra = extra if "--readers" in extra else (*extra, "--readers", "0")
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
    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="gp-overhead-") as tmp, start_sim(SIM_ARGS) as sim:
        folder = Path(tmp)
        for rep in range(REPEATS):
            for mode in MODES:  # alternating, so both modes see the same load on a shared machine
                short = cli_cpu(sim.url, short_dataset(folder, SHORT, mode), folder / f"out-{mode}-s{rep}")
                long = cli_cpu(sim.url, short_dataset(folder, LONG, mode), folder / f"out-{mode}-l{rep}")
                rows[mode].append({"cpu_short_s": short[0], "cpu_long_s": long[0], "wall_long_s": long[1],
                                   "marginal_ms": 1000 * (long[0] - short[0]) / (LONG - SHORT),
                                   "total_ms": 1000 * long[0] / LONG})
    out: dict = {"samples_short": SHORT, "samples_long": LONG, "repeats": REPEATS, "target_ms_per_sample": 1.0}
    for mode, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        out[mode] = {"runs": runs, "median_marginal_ms_per_sample": round(med["marginal_ms"], 3),
                     "median_total_ms_per_sample": round(med["total_ms"], 3),
                     "median_wall_long_s": round(med["wall_long_s"], 2), "pass": med["marginal_ms"] <= 1.0}
    return out


def main(argv: list[str] | None = None) -> None:
    r = measure()
    s, w = r["streamed"], r["whole"]
    table = md_table([f"figure (median of {REPEATS})", "streamed (default)", "whole (on_loop = \"off\")"], [
        ["marginal CPU per sample (ms)", s["median_marginal_ms_per_sample"], w["median_marginal_ms_per_sample"]],
        [f"total CPU per sample over {LONG} samples, start-up included (ms)", s["median_total_ms_per_sample"],
         w["median_total_ms_per_sample"]],
        [f"wall time of the {LONG}-sample run (s)", s["median_wall_long_s"], w["median_wall_long_s"]],
        ["target: ≤ 1.0 ms per sample", "PASS" if s["pass"] else "FAIL", "PASS" if w["pass"] else "FAIL"],
    ])
    md = (f"## Orchestrator CPU per sample\n\n`python -m bench overhead`: the CLI attached to the simulator "
          f"answering with ~zero latency (fast profile, time scale 1e6, ~24-token outputs); CPU from wait4() of the "
          f"CLI process; marginal = (CPU of a {LONG}-sample run − CPU of a {SHORT}-sample run) / {LONG - SHORT}. "
          "Streamed = the default (SSE chunks, each fed to the loop detector); whole = "
          "`[generation] on_loop = \"off\"` (one JSON answer a turn, no loop detector); the two alternate run by "
          "run.\n\n" + table)
    print(md)
    write_section("overhead", r, md)


if __name__ == "__main__":
    main()
