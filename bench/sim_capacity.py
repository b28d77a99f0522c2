"""Simulator capacity benchmark: can `python -m sglang_sim` keep its simulated clock in
step with real time x --time-scale while 300 requests are in flight over HTTP?

For each time scale (50, 100, 200, 400, 800) it starts the sim with the "seed" profile (mem 0.90,
fp8_e4m3 KV: the 376K-token config), drives 300 concurrent non-streaming chat requests with
B2-like sizes (prompt ~700 tokens, output lognormal mean 3500) from one httpx client process,
and after a warm-up of 900 simulated seconds measures over a window of 1500 simulated seconds:
  - keep-up ratio = simulated seconds elapsed / (real seconds x scale); 1.0 = on time,
  - lag the engine loop recorded (real seconds it fell behind and gave up catching up),
  - the sim process's CPU share (utime+stime from /proc), the share of real time its main thread
    sat runnable but waiting for a CPU (/proc/<pid>/schedstat: contention from other processes),
    and the engine's busy share (time inside Engine.step),
  - simulated gen tok/s (should not depend on the scale) and client-observed tok/s per real s.
The sim "keeps up" at a scale when keep-up >= 0.95. Writes section "sim_capacity".
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time
from collections.abc import Sequence
from typing import Any

import anyio
import httpx

from bench.report import md_table, write_section
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.lengths import draw_length
from sglang_sim.profiles import get_profile, kv_capacity_tokens
from sglang_sim.testing import start_sim
from sglang_sim.tokenizer import encode, render_chat

SCALES = (50, 100, 200, 400, 800)
CONCURRENCY = 300
# Windows are fixed in simulated time so every scale sees the same phase of the closed loop
# (all 300 requests start together; ~900 simulated s lets the first wave spread out).
WARMUP_SIM_S = 900.0
WINDOW_SIM_S = 1500.0
MIN_WARMUP_REAL_S = 3.0
KEEP_UP = 0.95
MAX_DISTORTION = 0.05  # |HTTP decode tok/sim s / in-process reference - 1|
MAX_CLIENT_STALL_S = 0.5
OUTPUT_MEAN, OUTPUT_SPREAD = 3500.0, 0.3
SIM_FLAGS = ["--sim-profile", "seed", "--mem-fraction-static", "0.90", "--kv-cache-dtype", "fp8_e4m3",
             "--num-continuous-decode-steps", "4", "--sim-output-mean", str(OUTPUT_MEAN),
             "--sim-output-spread", str(OUTPUT_SPREAD), "--log-level", "warning"]
_BODY = " ".join(["lorem ipsum dolor sit amet consectetur adipiscing elit sed do"] * 60)  # ~700 tokens


def _cpu_s(pid: int) -> float:
    """utime + stime of `pid` in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def reference_decode_tok_s(duration_sim_s: float = WARMUP_SIM_S + WINDOW_SIM_S) -> float:
    """Decode tok/s of the same closed loop run on the Engine in-process (no HTTP, no clock):
    what the sim should report per simulated second when it keeps up."""
    engine = Engine(EngineConfig(max_total_num_tokens=kv_capacity_tokens("seed", 0.90, "fp8_e4m3"),
                                 num_continuous_decode_steps=4), get_profile("seed", "fp8_e4m3"))
    prompt_len = len(encode(render_chat([{"role": "user", "content": f"Request 0-0. {_BODY}"}])))
    rng, next_id = random.Random(1), 0

    def add() -> None:
        nonlocal next_id
        next_id += 1
        n = min(8192, draw_length(rng.getrandbits(64), OUTPUT_MEAN, OUTPUT_SPREAD))
        base = next_id * 20_000  # unique token ids: no prefix sharing, like the HTTP run
        engine.add_request(str(next_id), range(base, base + prompt_len),
                           range(base + prompt_len, base + prompt_len + n), max_new_tokens=8192)

    for _ in range(CONCURRENCY):
        add()
    start = None
    while engine.now_s < duration_sim_s:
        for _ in engine.step().finished:
            add()
        if start is None and engine.now_s >= WARMUP_SIM_S:
            start = (engine.now_s, engine.counters()["decode_tokens_total"])
    return (engine.counters()["decode_tokens_total"] - start[1]) / (engine.now_s - start[0])


def _runqueue_wait_s(pid: int) -> float:
    """Seconds the sim's main thread spent runnable but waiting for a CPU (/proc/<pid>/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


class _Driver:
    def __init__(self, url: str) -> None:
        self.url = url
        self.completed = 0
        self.tokens = 0
        self.errors = 0
        self.error_kinds: set[str] = set()
        self.max_stall_s = 0.0

    async def heartbeat(self, period_s: float = 0.05) -> None:
        """Records the client's longest event-loop stall (a late wake-up of this task)."""
        while True:
            t0 = time.monotonic()
            await anyio.sleep(period_s)
            self.max_stall_s = max(self.max_stall_s, time.monotonic() - t0 - period_s)

    async def worker(self, client: httpx.AsyncClient, w: int) -> None:
        i = 0
        while True:
            i += 1
            body = {"messages": [{"role": "user", "content": f"Request {w}-{i}. {_BODY}"}], "max_tokens": 8192}
            try:
                r = await client.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                self.tokens += r.json()["usage"]["completion_tokens"]
                self.completed += 1
            except httpx.HTTPError as e:
                self.errors += 1
                self.error_kinds.add(f"{type(e).__name__}: {str(e)[:120]}")


async def _until_sim(client: httpx.AsyncClient, sim_target_s: float, real_cap_s: float,
                     samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Poll /sim/stats until the sim clock reaches `sim_target_s` (or `real_cap_s` passes)."""
    deadline = time.monotonic() + real_cap_s
    while True:
        stats = (await client.get("/sim/stats")).json()
        if samples is not None:
            samples.append(stats["load"])
        if stats["sim_time_s"] >= sim_target_s or time.monotonic() > deadline:
            return stats
        await anyio.sleep(0.25)


async def _drive(url: str, pid: int, scale: float) -> dict[str, Any]:
    driver = _Driver(url)
    limits = httpx.Limits(max_connections=CONCURRENCY + 10, max_keepalive_connections=CONCURRENCY + 10)
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=10.0, pool=None)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        async with anyio.create_task_group() as tg:
            for w in range(CONCURRENCY):
                tg.start_soon(driver.worker, client, w)
            tg.start_soon(driver.heartbeat)
            await anyio.sleep(MIN_WARMUP_REAL_S)  # let the client open its 300 connections first
            s0 = await _until_sim(client, WARMUP_SIM_S, 2 * WARMUP_SIM_S / scale)
            driver.max_stall_s = 0.0
            c0, q0, r0, k0 = _cpu_s(pid), _runqueue_wait_s(pid), time.monotonic(), _client_cpu_s()
            done0, tok0 = driver.completed, driver.tokens
            samples: list[dict[str, Any]] = []
            s1 = await _until_sim(client, s0["sim_time_s"] + WINDOW_SIM_S, 2 * WINDOW_SIM_S / scale, samples)
            c1, q1, r1, k1 = _cpu_s(pid), _runqueue_wait_s(pid), time.monotonic(), _client_cpu_s()
            done1, tok1 = driver.completed, driver.tokens
            tg.cancel_scope.cancel()
    return {"s0": s0, "s1": s1, "cpu_s": c1 - c0, "runqueue_wait_s": q1 - q0, "real_s": r1 - r0,
            "client_cpu_s": k1 - k0, "client_max_stall_s": driver.max_stall_s,
            "completed": done1 - done0,
            "tokens": tok1 - tok0, "errors": driver.errors, "error_kinds": sorted(driver.error_kinds),
            "samples": samples}


def _summarize(scale: float, m: dict[str, Any], reference: float) -> dict[str, Any]:
    s0, s1, real = m["s0"], m["s1"], m["real_s"]
    sim = s1["sim_time_s"] - s0["sim_time_s"]
    gen = s1["counters"]["generation_tokens_total"] - s0["counters"]["generation_tokens_total"]
    decoded = s1["counters"].get("decode_tokens_total", 0) - s0["counters"].get("decode_tokens_total", 0)
    running = sorted(x["num_running_reqs"] for x in m["samples"])
    waiting = sorted(x["num_waiting_reqs"] for x in m["samples"])
    in_flight = sorted(x["num_running_reqs"] + x["num_waiting_reqs"] for x in m["samples"])
    decode_rate = decoded / sim if sim else 0.0
    return {
        "time_scale": scale,
        "keep_up": round(sim / (real * scale), 3),
        "window_real_s": round(real, 1),
        "lag_real_s": round(s1["lag_total_real_s"] - s0["lag_total_real_s"], 2),
        "sim_cpu_share": round(m["cpu_s"] / real, 2),
        "sim_runqueue_wait_share": round(m["runqueue_wait_s"] / real, 2),
        "engine_busy_share": round((s1["busy_real_s"] - s0["busy_real_s"]) / real, 2),
        "steps_per_real_s": round((s1["steps"] - s0["steps"]) / real, 1),
        "median_running_reqs": running[len(running) // 2],
        "median_waiting_reqs": waiting[len(waiting) // 2],
        "median_in_engine_reqs": in_flight[len(in_flight) // 2],
        "sim_decode_tok_per_sim_s": round(decode_rate, 1),
        "reference_decode_tok_per_sim_s": round(reference, 1),
        "distortion": round(decode_rate / reference - 1, 3),
        "client_cpu_share": round(m["client_cpu_s"] / real, 2),
        "client_max_stall_real_s": round(m["client_max_stall_s"], 2),
        "sim_max_step_real_s": round(s1["max_step_real_s"], 3),
        "sim_gen_tok_per_sim_s": round(gen / sim, 1) if sim else 0.0,
        "client_completed": m["completed"],
        "client_tok_per_real_s": round(m["tokens"] / real, 1),
        "client_errors": m["errors"],
        "client_error_kinds": m["error_kinds"],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run_scale(scale: float, reference: float) -> dict[str, Any]:
    with start_sim([*SIM_FLAGS, "--time-scale", str(scale)], ready_timeout_s=60) as sim:
        return _summarize(scale, anyio.run(_drive, sim.url, sim.process.pid, scale), reference)


def _verdict(r: dict[str, Any]) -> str:
    if r["keep_up"] >= KEEP_UP and abs(r["distortion"]) <= MAX_DISTORTION:
        return "keeps up"
    if r["median_in_engine_reqs"] < 0.9 * CONCURRENCY or r["client_max_stall_real_s"] > MAX_CLIENT_STALL_S:
        return "distorted (client stalls: cannot keep 300 in flight)"
    return "distorted (sim behind)"


def _markdown(rows: list[dict[str, Any]], reference: float, wall_s: float) -> str:
    headers = ["time scale", "keep-up (sim/real×scale)", "decode tok/sim s", "distortion vs in-process",
               "in engine (median)", "running (median)", "lag (real s)", "sim CPU", "sim waiting for a CPU",
               "engine busy", "sim max step (real s)", "client CPU", "client max stall (s)", "client tok/real s",
               "load avg", "verdict"]
    table = [[r["time_scale"], r["keep_up"], r["sim_decode_tok_per_sim_s"], f"{r['distortion']:+.1%}",
              r["median_in_engine_reqs"], r["median_running_reqs"], r["lag_real_s"], r["sim_cpu_share"],
              r["sim_runqueue_wait_share"], r["engine_busy_share"], r["sim_max_step_real_s"], r["client_cpu_share"],
              r["client_max_stall_real_s"], r["client_tok_per_real_s"], r["load_avg_1m"], _verdict(r)] for r in rows]
    ok = [r["time_scale"] for r in rows if _verdict(r) == "keeps up"]
    limit = f"keeps up to time scale {max(ok):g}" if ok else "does not keep up at any tested scale"
    return (f"## Simulator capacity (sim_capacity)\n\n{CONCURRENCY} concurrent non-streaming chat requests over "
            f"HTTP from one httpx client process; seed profile, 376K-token pool (mem 0.90, fp8_e4m3), prompts "
            f"~700 tokens, outputs lognormal mean {OUTPUT_MEAN:.0f}; warm-up {WARMUP_SIM_S:.0f} simulated s, "
            f"window {WINDOW_SIM_S:.0f} simulated s per scale. Reference: the same closed loop on the engine "
            f"in-process decodes {reference:.0f} tok per simulated s. On this machine the sim {limit} "
            f"(keep-up >= {KEEP_UP} and distortion within {MAX_DISTORTION:.0%}). Past that, simulated time "
            f"stretches and the figures per simulated second drift from the model: 'sim waiting for a CPU' and "
            f"'client CPU' show whether the sim, the client or the rest of the machine is short of CPU "
            f"(2 shared cores; load average in the table). Wall {wall_s:.0f} s.\n\n"
            + md_table(headers, table))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=list(SCALES))
    args = parser.parse_args(list(argv) if argv is not None else None)
    started = time.monotonic()
    reference = reference_decode_tok_s()
    print(f"in-process reference: {reference:.1f} decode tok per simulated s", flush=True)
    rows = []
    for scale in args.scales:
        row = run_scale(scale, reference)
        print(row, flush=True)
        rows.append(row)
    wall = time.monotonic() - started
    markdown = _markdown(rows, reference, wall)
    write_section("sim_capacity", {"rows": rows, "concurrency": CONCURRENCY, "keep_up_threshold": KEEP_UP,
                                   "max_distortion": MAX_DISTORTION, "reference_decode_tok_per_sim_s":
                                   round(reference, 1), "wall_s": round(wall, 1)}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
