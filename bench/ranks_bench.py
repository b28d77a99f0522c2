"""Ranks benchmark: dataset throughput with 1, 2 and 4 ranks (`generate --rank R --world-size W` as
real CLI processes), each rank attached to its own simulated server, as on W nodes. Weak scaling:
every rank has the same share (PER_RANK samples), so linear = W x the one-rank rate.

On a 2-core machine W simulators and W orchestrators compete for CPU, so the figures are in the
simulators' own clocks: each sim's simulated time runs at --time-scale x real time while it keeps
up and slower when it is starved (its loop counts the shortfall as lag), so samples per simulated
second is what the rank would do on hardware of its own. The bench polls every sim's /sim/stats
(simulated time, requests completed) and reports per rank the steady rate between 10 % and 90 %
of its share, and the makespan rate (share / simulated time from its first request to its last
completion); the dataset's rate is the sum over ranks. The time scale is kept low (the sims do a
fraction of real time's work) and every process's CPU share and the sims' lag are reported, so
a starved run shows. Writes section "ranks".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.report import md_table, write_section
from sglang_sim.testing import start_sim

REPO = Path(__file__).resolve().parent.parent
WORLDS = (1, 2, 4)
PER_RANK = 480
WINDOW = 32  # fixed concurrency per rank: the bench measures ranks, not the controller's ramp
TIME_SCALE = 0.5
SIM_FLAGS = ["--sim-profile", "fast", "--sim-startup-s", "0", "--sim-output-mean", "160", "--sim-output-spread", "0.3",
             "--log-level", "warning"]
LINEAR_SHARE = 0.9  # the target: >= 0.9 x linear at 4 ranks
POLL_S = 0.05


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dataset(folder: Path, world: int) -> Path:
    """Rows enough for every rank's hash slice to cover its share (checked by the run's exit line)."""
    rows = int(world * PER_RANK * 1.4) + 60
    data = folder / "R.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": f"q{i}", "messages": [
        {"role": "user", "content": f"Question {i}: explain topic {i % 31} in a few sentences."}]}) + b"\n"
        for i in range(rows)))
    toml = folder / "R.toml"
    toml.write_text(f'name = "R"\ntarget_samples = {world * PER_RANK}\n[source]\nfiles = ["R.jsonl"]\n'
                    'schema = "messages"\nfield = "messages"\nid_field = "id"\n[sampling]\nmax_new_tokens = 512\n'
                    '[generation]\nreasoning = "none"\nrequest_timeout_s = 120\n'
                    '[output]\nshard_max_samples = 2000\nfsync_every = 64\n')
    return toml


def _poll(http: httpx.Client, url: str) -> tuple[float, int, float, int]:
    d = http.get(f"{url}/sim/stats").json()
    return float(d["sim_time_s"]), int(d["requests_completed"]), float(d["lag_total_real_s"]), int(d["requests_seen"])


def _rank_rates(trace: list[tuple[float, float, int, float, int]], share: int) -> dict[str, float]:
    """From (real t, sim t, completed, lag, seen) polls of one sim: steady and makespan rates in samples/sim s."""
    def first(n: int) -> tuple[float, float, int, float, int]:
        return next(p for p in trace if p[2] >= n)
    lo, hi = first(max(1, share // 10)), first(share * 9 // 10)
    start = next(p for p in reversed(trace) if p[4] == 0)  # the last poll before the rank's first request
    end = first(share)
    return {"steady_per_sim_s": (hi[2] - lo[2]) / (hi[1] - lo[1]),
            "makespan_per_sim_s": share / (end[1] - start[1]),
            "lag_real_s": end[3] - start[3], "sim_s": end[1] - start[1], "real_s": end[0] - start[0],
            "head_sim_s": lo[1] - start[1], "tail_sim_s": end[1] - hi[1]}


def measure_world(world: int, folder: Path) -> dict[str, Any]:
    toml = _dataset(folder, world)
    out = folder / "out"
    with ExitStack() as stack, httpx.Client(timeout=5.0) as http:
        sims = [stack.enter_context(start_sim([*SIM_FLAGS, "--time-scale", str(TIME_SCALE)], ready_timeout_s=60))
                for _ in range(world)]
        urls = [f"http://127.0.0.1:{s.port}" for s in sims]
        traces: list[list[tuple[float, float, int, float, int]]] = [[] for _ in range(world)]
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "gen_pipeline", "generate", "--dataset", str(toml),
                                   "--server-url", urls[r], "--output-dir", str(out), "--progress", "quiet",
                                   "--window", str(WINDOW), "--rank", str(r), "--world-size", str(world)],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
        while any(p.poll() is None for p in procs):
            for r, url in enumerate(urls):
                traces[r].append((time.monotonic() - t0, *_poll(http, url)))
            time.sleep(POLL_S)
        for r, url in enumerate(urls):
            traces[r].append((time.monotonic() - t0, *_poll(http, url)))
        wall_s = time.monotonic() - t0
        sim_cpu = [_cpu_s(s.process.pid) for s in sims]
        logs = [p.stdout.read().decode() for p in procs]
        for p in procs:
            p.stdout.close()
        rcs = [p.returncode for p in procs]
    if rcs != [0] * world or not all("target reached." in log for log in logs):
        raise RuntimeError(f"a rank failed ({rcs}): {logs}")
    ranks = [_rank_rates(t, PER_RANK) for t in traces]
    return {"world": world, "samples": world * PER_RANK, "wall_s": round(wall_s, 2), "ranks": ranks,
            "steady_per_sim_s": sum(r["steady_per_sim_s"] for r in ranks),
            "makespan_per_sim_s": sum(r["makespan_per_sim_s"] for r in ranks),
            "slowest_rank_makespan_per_sim_s": world * min(r["makespan_per_sim_s"] for r in ranks),
            "max_lag_real_s": max(r["lag_real_s"] for r in ranks),
            "max_head_sim_s": max(r["head_sim_s"] for r in ranks),
            "max_tail_sim_s": max(r["tail_sim_s"] for r in ranks),
            "sim_cpu_share": round(sum(sim_cpu) / wall_s / world, 3),
            "real_per_s": world * PER_RANK / wall_s}


def measure(worlds: Sequence[int] = WORLDS) -> dict[str, Any]:
    rows = []
    for world in worlds:
        with tempfile.TemporaryDirectory(prefix=f"gp-ranks-{world}-") as tmp:
            rows.append(measure_world(world, Path(tmp)))
    base = rows[0]
    for r in rows:
        for key in ("steady_per_sim_s", "makespan_per_sim_s", "slowest_rank_makespan_per_sim_s"):
            r[key.replace("per_sim_s", "of_linear")] = r[key] / (r["world"] * base[key] / base["world"])
    last = rows[-1]
    return {"per_rank": PER_RANK, "window": WINDOW, "time_scale": TIME_SCALE, "sim_flags": SIM_FLAGS, "rows": rows,
            "target_share_of_linear": LINEAR_SHARE,
            "pass": (last["steady_of_linear"] >= LINEAR_SHARE
                     and last["slowest_rank_makespan_of_linear"] >= LINEAR_SHARE)}


def _markdown(r: dict[str, Any]) -> str:
    table = md_table(
        ["ranks", "samples", "steady samples/sim s", "× linear", "makespan samples/sim s (slowest rank × W)",
         "× linear", "first 10 % / last 10 % (sim s, slowest)", "max sim lag (real s)", "sim CPU share", "wall s",
         "samples/real s"],
        [[x["world"], x["samples"], f"{x['steady_per_sim_s']:.1f}", f"{x['steady_of_linear']:.3f}",
          f"{x['slowest_rank_makespan_per_sim_s']:.1f}", f"{x['slowest_rank_makespan_of_linear']:.3f}",
          f"{x['max_head_sim_s']:.2f} / {x['max_tail_sim_s']:.2f}", f"{x['max_lag_real_s']:.2f}",
          f"{x['sim_cpu_share']:.2f}", f"{x['wall_s']:.1f}", f"{x['real_per_s']:.1f}"]
         for x in r["rows"]])
    verdict = "PASS" if r["pass"] else "FAIL"
    return (f"## Ranks: many orchestrators, one dataset\n\n`python -m bench ranks`: W ranks as W `generate --rank R "
            f"--world-size W` processes, each attached to its own simulator (fast profile, time scale "
            f"{r['time_scale']}, ~160-token outputs, fixed --window {r['window']}), {r['per_rank']} samples per rank "
            "(weak scaling: linear = W × the 1-rank rate). Rates are in each simulator's own clock (samples per "
            "simulated second, from its /sim/stats polled every 50 ms), so CPU contention between the W sims on "
            "this 2-core machine slows their clocks, not the figure; steady = between 10 % and 90 % of the share, "
            "makespan = the share over the simulated time from the rank's first request to its last sample, "
            "slowest rank × W (the dataset ends when its slowest rank does). Sim lag is real time its loop fell "
            "behind; sim CPU share is per sim process. samples/real s is wall-clock and does suffer contention.\n\n"
            f"{table}\n\nTarget ≥ {r['target_share_of_linear']} × linear at 4 ranks (steady and makespan): {verdict}. "
            "Reading: the ranks share nothing but the filesystem, so the steady rate is linear; what makespan loses "
            "is in the columns \"first 10 % / last 10 %\": each rank ends with the drain of its last window, where "
            "its slowest remaining request sets the end, and the dataset waits for the slowest of W ranks. "
            "samples/real s includes each CLI's start-up (Python, the source) on this machine's 2 shared cores.\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ranks_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    args = p.parse_args(argv or [])
    r = measure(args.worlds)
    md = _markdown(r)
    print(md)
    if args.worlds == list(WORLDS):
        write_section("ranks", r, md)


if __name__ == "__main__":
    main(sys.argv[1:])
