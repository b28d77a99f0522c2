"""Scale-out throughput (issue 11.1): 1, 2 and 4 simulated servers, through sglang-router and direct
(`--server-url A,B,C`), the real CLI, simulators and router as processes.

This machine has 2 cores, so several simulators would starve each other in wall time. Throughput is
therefore read on the simulators' own clocks: each runs time-scaled (`--time-scale`, simulated seconds
per real second) and re-anchors its clock when it falls behind, so its `sim_time_s` (/sim/stats)
advances by the work it did, not by the CPU it waited for. A run's duration is the mean over its
servers of their simulated seconds from the first request to the last; throughput = samples / that.
At time scale 2 four servers take ~60 requests/s of the client, well within one core.

    python -m bench fleet            (python -m bench.fleet_scale --target-per-server 250 --time-scale 2)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from bench.report import md_table, write_section
from sglang_sim.testing import SimProcess, free_port, start_sim

REPO = Path(__file__).resolve().parent.parent
SIM = ["--sim-profile", "seed", "--sim-startup-s", "0", "--sim-output-mean", "160", "--sim-output-spread", "0.6",
       "--max-total-tokens", "20000"]  # KV-bound: one server's throughput is its KV, so servers add up


POLICIES = {"router": "cache_aware", "router-rr": "round_robin"}  # the router's default, and the plainest


def sim_time_s(sim: SimProcess) -> float:
    return float(httpx.get(sim.url + "/sim/stats", timeout=10).json()["sim_time_s"])


def _seen(sim: SimProcess) -> int:
    return int(httpx.get(sim.url + "/sim/stats", timeout=10).json()["requests_seen"])


@contextmanager
def router(sims: list[SimProcess], log: Path, policy: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_OFFLINE": "1"}  # no hub: the tokenizer fetch fails fast
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[s.url for s in sims],
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn", "--policy", policy,
           "--prometheus-port", str(free_port())]  # its default 29000 collides with a second router
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"sglang-router did not start; see {log}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def write_dataset(folder: Path, target: int) -> Path:
    import orjson
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i} about topic {i % 17}."}]}
            for i in range(target + 50)]
    (folder / "B.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    toml = folder / "B.toml"
    toml.write_text(f'name = "B"\ntarget_samples = {target}\n[source]\nfiles = ["B.jsonl"]\nschema = "messages"\n'
                    'field = "messages"\nid_field = "id"\n[sampling]\nmax_new_tokens = 256\n'
                    '[generation]\nrequest_timeout_s = 120\n')
    return toml


def run_one(mode: str, servers: int, target: int, time_scale: float, work: Path) -> dict:
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim([*SIM, "--time-scale", str(time_scale)], ready_timeout_s=60))
                for _ in range(servers)]
        url = (",".join(s.url for s in sims) if mode == "direct" else
               stack.enter_context(router(sims, work / f"{mode}-{servers}.log", POLICIES[mode])))
        toml = write_dataset(work / f"{mode}-{servers}", target)
        started = time.monotonic()
        cli = subprocess.Popen([sys.executable, "-m", "gen_pipeline", "generate", "--dataset", str(toml),
                                "--server-url", url, "--output-dir", str(work / f"out-{mode}-{servers}"),
                                "--progress", "quiet"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while cli.poll() is None and not any(_seen(s) for s in sims):
            time.sleep(0.02)  # the clocks start at the first request, not at the CLI's start-up
        before = [sim_time_s(s) for s in sims]
        _, stderr = cli.communicate(timeout=900)
        wall_s = time.monotonic() - started
        if cli.returncode != 0:
            raise RuntimeError(f"{mode} x{servers} failed: {stderr.decode()[-2000:]}")
        sim_s = [sim_time_s(s) - b for s, b in zip(sims, before, strict=True)]
        seen = [_seen(s) for s in sims]
    mean_sim_s = sum(sim_s) / len(sim_s)
    return {"mode": mode, "servers": servers, "samples": target, "sim_s": round(mean_sim_s, 2),
            "samples_per_sim_s": round(target / mean_sim_s, 3), "wall_s": round(wall_s, 1), "requests_per_server": seen}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_scale", description=__doc__.split("\n")[0])
    p.add_argument("--target-per-server", type=int, default=250)
    p.add_argument("--time-scale", type=float, default=2.0)
    p.add_argument("--servers", default="1,2,4")
    args = p.parse_args(argv or [])
    counts = [int(x) for x in args.servers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for mode in ("direct", *POLICIES):
            for n in counts:
                r = run_one(mode, n, args.target_per_server * n, args.time_scale, Path(tmp))
                base = next((x for x in rows if x["mode"] == mode and x["servers"] == counts[0]), r)
                r["vs_linear"] = round(r["samples_per_sim_s"] / (base["samples_per_sim_s"] * n / counts[0]), 3)
                rows.append(r)
                print(f"{mode:7s} x{n}: {r['samples_per_sim_s']:.2f} samples/sim-s ({r['vs_linear']:.2f} x linear), "
                      f"{r['sim_s']:.1f} sim-s, {r['wall_s']:.1f} s wall, requests {r['requests_per_server']}",
                      flush=True)
    for r in rows:
        seen = r["requests_per_server"]
        r["busiest_vs_mean"] = round(max(seen) * len(seen) / sum(seen), 3)
    table = md_table(["mode", "servers", "samples", "sim s (mean)", "samples/sim-s", "× linear", "wall s",
                      "requests per server", "busiest / mean"],
                     [[r["mode"], r["servers"], r["samples"], r["sim_s"], r["samples_per_sim_s"], r["vs_linear"],
                       r["wall_s"], " / ".join(map(str, r["requests_per_server"])), r["busiest_vs_mean"]]
                      for r in rows])
    md = f"""## Scale-out: servers behind sglang-router and direct (`python -m bench fleet`)

`python -m bench fleet` (= `python -m bench.fleet_scale --target-per-server {args.target_per_server}
--time-scale {args.time_scale:g}`):
the real CLI over 1, 2 and 4 simulator processes (seed profile, 20,000 KV tokens each, 256 max new tokens),
direct (`--server-url A,B,C`: each request to the server with the most free KV) and through the real
sglang-router 0.3 binary, with its default policy (`router`: cache_aware) and `--policy round_robin`
(`router-rr`). Throughput is on the simulators' clocks (time scale
{args.time_scale:g}; a simulator that falls behind re-anchors, so CPU contention on this 2-core machine does
not count as server time): samples / mean simulated seconds over the servers, from the first request to
the end (the CLI's start-up excluded). Target ≥ 0.9 × linear at 4.
"busiest / mean": the most requests one server got over the mean; a KV-bound run ends when its busiest
server does, so × linear is at best 1 / that. The prompts share a prefix ("Question N about topic"),
which cache_aware routing keeps on one worker until its balance thresholds trip.

{table}
"""
    write_section("fleet_scale", {"rows": rows, "time_scale": args.time_scale}, md)
    print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
