"""`python -m bench gate`: the quality gate wired into a run (issue 22), on the simulator process.

1. Gate on vs off: a B2-like run (seed profile, reasoning parser, prompts of ~700 tokens, lognormal
   outputs, max_new_tokens 8,192) where 2 % of turns loop (`--sim-loop-rate 0.02`: each runs to the
   8,192 cap unless the client hangs up), once per `on_loop` ("off": no detector; "drop"; "retry"), each
   on a fresh simulator with the same prompts and a fixed window. Measured on the simulator: every loop's
   start and the tokens it decoded (/sim/stats "loops"), the tokens the engine decoded in all and its
   busy simulated seconds (the GPU-seconds of a one-GPU server); reported by the tool: `status --json`'s
   gate counts and its saved estimate (quality/accounting.py).
2. Streaming client CPU: the whole `generate` process's CPU (user + sys from wait4) per 1,000 streamed
   tokens, marginal over a small and a large run (start-up cancels), at SGLang stream intervals 1, 4 and
   16 (`--stream-interval`: tokens per SSE chunk), and the share of one core that is at ~16K tok/s (H200,
   small model) and ~1.4K tok/s (Kimi-K2.5).
Outputs are scaled down from B2's ~3,200 tokens (mean 400 here) so a mode runs in well under two minutes on
a shared 2-core machine; the loop cap stays 8,192.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.report import md_table, write_section
from sglang_sim.testing import start_sim

REPO = Path(__file__).resolve().parent.parent
SEED = 22
MAX_NEW = 8192
LOOP_RATE = 0.02
ROWS = 300
WINDOW = 64
# time scale 6 with the gate (the client reads ~10K tok/s here and hangs up near the loop's start); 12 without
# (nothing is aborted, so only simulated time counts: the loops' 8,192-token tail would take 3 min at 6)
TIME_SCALE = {"off": "12"}
GATE_SIM = ["--sim-profile", "seed", "--sim-startup-s", "0", "--reasoning-parser", "kimi_k2",
            "--sim-output-mean", "400", "--sim-output-spread", "0.5", "--stream-interval", "4"]
CPU_SIM = ["--sim-profile", "fast", "--time-scale", "20", "--sim-startup-s", "0", "--reasoning-parser", "kimi_k2",
           "--sim-output-mean", "400", "--sim-output-spread", "0.3"]
CPU_ROWS = (8, 96)
INTERVALS = (1, 4, 16)
RATES = (16_000, 1_400)
CAUGHT = re.compile(r"loop caught in \S+: request (\w+): .*?; aborted after (\d+) tokens")


def _rows(n: int) -> list[dict[str, Any]]:
    filler = ("Explain the derivation step by step, state every assumption, and check the result against "
              "a worked example. ")
    return [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Problem {i}: " + filler * (25 + i % 7)}]}
            for i in range(n)]


def _dataset(folder: Path, rows: int, on_loop: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "G.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _rows(rows)))
    toml = folder / "G.toml"
    toml.write_text(f"""name = "G"
target_samples = {rows}
[source]
files = ["G.jsonl"]
schema = "messages"
field = "messages"
id_field = "id"
[sampling]
max_new_tokens = {MAX_NEW}
temperature = 0.7
top_p = 0.95
[generation]
reasoning = "keep"
truncated = "keep"
on_loop = "{on_loop}"
max_attempts = 4
""")
    return toml


def _generate(toml: Path, url: str, out: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the generate process, exit code)."""
    cmd = [sys.executable, "-m", "gen_pipeline", "generate", "--dataset", str(toml), "--server-url", url,
           "--output-dir", str(out), "--progress", "quiet", "--window", str(WINDOW)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - t0, usage.ru_utime + usage.ru_stime, proc.returncode


def _status(out: Path, toml: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "gen_pipeline", "status", "--dataset", "G", "--output-dir", str(out),
                        "--config-dir", str(toml.parent), "--json"], cwd=REPO, capture_output=True, text=True)
    return orjson.loads(r.stdout)["datasets"]["G"]


def gate_mode(on_loop: str, tmp: Path, rows: int = ROWS) -> dict[str, Any]:
    with start_sim([*GATE_SIM, "--time-scale", TIME_SCALE.get(on_loop, "6"), "--sim-loop-rate", str(LOOP_RATE),
                    "--sim-seed", str(SEED)], ready_timeout_s=60) as sim:
        toml, out = _dataset(tmp / on_loop / "cfg", rows, on_loop), tmp / on_loop / "out"
        wall, cpu, rc = _generate(toml, sim.url, out)
        stats = httpx.get(sim.url + "/sim/stats", timeout=10).json()
    st = _status(out, toml)
    loops = stats["loops"]
    past = sorted(x["decoded"] - x["loop_start"] for x in loops)
    # run.log's line per loop caught: the tokens the client had seen when it closed the stream
    caught = {m[1]: int(m[2]) for m in CAUGHT.finditer((out / "G" / "run.log").read_text())}
    seen = sorted(caught[x["rid"]] - x["loop_start"] for x in loops if x["rid"] in caught)
    return {
        "on_loop": on_loop, "rc": rc, "wall_s": round(wall, 1), "client_cpu_s": round(cpu, 1),
        "samples": st["done"], "failed": st["errors_unresolved"],
        "sim_loops": len(loops), "loops_aborted": sum(x["finish_reason"] == "abort" for x in loops),
        "loops_to_cap": sum(x["decoded"] >= MAX_NEW for x in loops),
        "max_tokens_past_loop_start": past[-1] if past else None,
        "loops_caught_by_client": len(seen),
        "max_seen_past_loop_start": seen[-1] if seen else None,
        "median_seen_past_loop_start": seen[len(seen) // 2] if seen else None,
        "sim_max_lag_real_s": round(stats["max_lag_real_s"], 2),
        "median_tokens_past_loop_start": past[len(past) // 2] if past else None,
        "decoded_tokens": stats["counters"]["decode_tokens_total"],
        "sim_busy_s": round(stats["busy_sim_s"], 1),
        "gate": st["gate"], "server_s_saved_estimate": st.get("server_s_saved"),
    }


def cpu_mode(interval: int, tmp: Path, repeats: int = 3) -> dict[str, Any]:
    """Client CPU per 1K streamed tokens at one stream interval (marginal between two run sizes), the
    median of `repeats` pairs."""
    pairs = []
    with start_sim([*CPU_SIM, "--stream-interval", str(interval), "--sim-seed", str(SEED)], ready_timeout_s=60) as sim:
        for k in range(repeats):
            runs = []
            for rows in CPU_ROWS:
                out = tmp / f"cpu{interval}-{rows}-{k}"
                toml = _dataset(out / "cfg", rows, "retry")
                wall, cpu, rc = _generate(toml, sim.url, out / "out")
                st = _status(out / "out", toml)
                runs.append((st["completion_tokens"], cpu, wall))
            (t0, c0, _), (t1, c1, w1) = runs
            pairs.append(((c1 - c0) / (t1 - t0) * 1000, t1 / w1))
    per_1k = statistics.median(p[0] for p in pairs)  # CPU seconds per 1K tokens
    return {"stream_interval": interval, "repeats": repeats, "cpu_ms_per_1k_tokens_each": [round(p[0] * 1000, 2)
                                                                                         for p in pairs],
            "tokens_per_s_reached": round(statistics.median(p[1] for p in pairs)),
            "cpu_ms_per_1k_tokens": round(per_1k * 1000, 2),
            "core_share_percent": {str(r): round(per_1k * r / 1000 * 100, 1) for r in RATES}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench gate", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--modes", default="off,drop,retry")
    ap.add_argument("--skip-cpu", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as d:
        tmp = Path(d)
        modes = [gate_mode(m, tmp, args.rows) for m in args.modes.split(",")]
        cpu = [] if args.skip_cpu else [cpu_mode(i, tmp) for i in INTERVALS]
    write(modes, cpu, args.rows)


def _est_sim_s(m: dict[str, Any]) -> float | None:
    """The tool's estimate (status: real-clock server-seconds) on the simulator's clock."""
    est = m["server_s_saved_estimate"]
    return None if est is None else round(est * float(TIME_SCALE.get(m["on_loop"], "6")), 1)


def _verdict(modes: list[dict[str, Any]], off: dict[str, Any] | None) -> str:
    lines = []
    for m in modes:
        if m["on_loop"] == "off":
            lines.append(f"- off: {m['sim_loops']} loops, {m['loops_to_cap']} ran to the 8,192 cap.")
            continue
        line = (f"- {m['on_loop']}: {m['loops_caught_by_client']} of {m['sim_loops']} loops caught and aborted "
                f"({m['loops_to_cap']} ran to the cap); the client had read a median {m['median_seen_past_loop_start']}"
                f" / max {m['max_seen_past_loop_start']} tokens past the loop's start when it hung up")
        if off is not None:
            tok, sim_s = off["decoded_tokens"] - m["decoded_tokens"], off["sim_busy_s"] - m["sim_busy_s"]
            line += (f"; against off: {tok:,} tokens ({100 * tok / off['decoded_tokens']:.0f} % of its decode) and "
                     f"{sim_s:.0f} busy server-seconds ({100 * sim_s / off['sim_busy_s']:.0f} %) not spent, where the "
                     f"tool estimated {_est_sim_s(m)} s (its {m['server_s_saved_estimate']} server-s on the real "
                     "clock × the time scale)")
        lines.append(line + ".")
    return ("\n\n" + "\n".join(lines) + "\n\nThe estimate prices each token not decoded at the run's average cost per "
            "token (a slot's share of a full batch); measured, the loops cost far more here because they ran on "
            "alone after the other prompts were done (a decode step of one request costs nearly what a step of 64 "
            "does): in a long job the loops share full batches and the estimate is the closer figure.")


def _cpu_verdict(cpu: list[dict[str, Any]]) -> str:
    by = {c["stream_interval"]: c for c in cpu}
    one, four = by.get(1), by.get(4)
    if one is None or four is None:
        return ""
    return (f"\n\nClient CPU: one token a chunk (SGLang's default stream interval) costs {one['cpu_ms_per_1k_tokens']} "
            f"ms per 1K tokens: {one['core_share_percent']['16000']} % of a core at 16K tok/s, "
            f"{one['core_share_percent']['1400']} % at 1.4K tok/s. With `--stream-interval 4` "
            f"{four['core_share_percent']['16000']} % at 16K tok/s; what it costs the detector: it sees 4 tokens a "
            "delta, so the abort comes at most 3 tokens later (against ~300 tokens from the loop's start to the "
            "verdict).")


def write(modes: list[dict[str, Any]], cpu: list[dict[str, Any]], rows: int) -> None:
    off = next((m for m in modes if m["on_loop"] == "off"), None)
    table = md_table(
        ["on_loop", "samples", "failed", "loops (sim)", "caught", "aborted", "ran to 8,192", "client: median / max "
         "tokens past loop start", "server: median / max", "tokens decoded (sim)", "sim busy s", "vs off: tokens",
         "vs off: sim s",
         "tool: tokens not decoded", "tool: saved estimate (sim s)", "wall s"],
        [[m["on_loop"], m["samples"], m["failed"], m["sim_loops"], m["loops_caught_by_client"], m["loops_aborted"],
          m["loops_to_cap"], f"{m['median_seen_past_loop_start']} / {m['max_seen_past_loop_start']}",
          f"{m['median_tokens_past_loop_start']} / {m['max_tokens_past_loop_start']}", f"{m['decoded_tokens']:,}",
          m["sim_busy_s"],
          "" if off is None or m is off else f"{off['decoded_tokens'] - m['decoded_tokens']:+,}",
          "" if off is None or m is off else f"{off['sim_busy_s'] - m['sim_busy_s']:+.1f}",
          f"{m['gate'].get('tokens_not_decoded', 0):,}", _est_sim_s(m), m["wall_s"]] for m in modes])
    md = (f"## Quality gate in a run: loops aborted, decode saved (`python -m bench gate`)\n\n"
          f"B2-like simulator run: `python -m sglang_sim {' '.join(GATE_SIM)} --time-scale 6 (12 for off) "
          f"--sim-loop-rate {LOOP_RATE} --sim-seed {SEED}` (seed profile = a one-GPU server; outputs scaled to a "
          f"mean of 400 tokens so a run takes < 2 min here), {rows} one-turn prompts of ~700 tokens, "
          f"max_new_tokens {MAX_NEW:,}, fixed window {WINDOW}, one fresh simulator per mode. `off` = no detector "
          "(loops run to the cap: written as truncated, or a failure `truncated` when the loop began inside the "
          "thinking, which it then never leaves); `drop` = a looping sample fails at once; `retry` = a new seed. "
          "\"client: tokens past loop start\" = tokens the client had read past the loop's first token "
          "when its detector fired and it closed the stream "
          "(run.log's line per loop, joined on the server's request id); \"server:\" = what the engine had decoded "
          "when the abort landed (+ the sim's own delivery lag on this busy machine and the abort's latency). "
          "\"vs off\" = the same prompts without the gate, measured on the simulator (positive = saved); "
          "the tool's estimate = tokens not decoded × the run's server-seconds per decoded token "
          "(quality/accounting.py; × GPUs for GPU-seconds), shown on the simulator's clock (status reports real "
          "seconds: × the time scale).\n\n" + table + _verdict(modes, off))
    if cpu:
        md += ("\n\n### Stream interval: the streaming client's CPU\n\n"
               "Streaming client CPU (the whole `generate` process, user + sys from wait4, marginal between "
               f"{CPU_ROWS[0]} and {CPU_ROWS[1]} one-turn samples of ~400 tokens, window {WINDOW}, median of "
               f"{cpu[0].get('repeats', 1)} pairs; `python -m "
               f"sglang_sim {' '.join(CPU_SIM)} --stream-interval N`; loop detector on, every delta fed):\n\n"
               + md_table(["stream interval (tokens per chunk)", "tokens/s reached here", "CPU ms per 1K tokens "
                           "(median; each pair)", "share of a core at 16K tok/s", "at 1.4K tok/s"],
                          [[c["stream_interval"], c["tokens_per_s_reached"],
                            f"{c['cpu_ms_per_1k_tokens']} ({', '.join(map(str, c['cpu_ms_per_1k_tokens_each']))})",
                            f"{c['core_share_percent']['16000']} %", f"{c['core_share_percent']['1400']} %"]
                           for c in cpu]) + _cpu_verdict(cpu))
    print(md)
    write_section("gate", {"modes": modes, "cpu": cpu}, md)


if __name__ == "__main__":
    main()
