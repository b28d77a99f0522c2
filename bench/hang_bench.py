"""`python -m bench hang`: how soon a hung member of a fleet is taken out and its requests re-sent.

Three simulators (`fast` profile at time scale 0.2: a few seconds per request), `generate` of 300 samples
attached to all three at the shipped defaults (--health-interval-s 5, --hang-timeout-s 5;
request_timeout_s 600), one simulator SIGSTOPped once 30 samples are written. Per trial, from the
SIGSTOP (the wall clock of this process):
- taken out: the `took URL out` line's own timestamp in run.log (UTC, ms);
- re-sent: the first 50 ms from the take-out on in which the two live simulators together received at
  least half as many new requests as the line says were re-sent (their /sim/stats requests_seen, polled
  every 10 ms; before the take-out the run's own refills can come in such bursts too);
- the silence the tool measured (the line's "no progress for X s").
Medians over the trials. The run must end exact (300 samples, no duplicate); a trial that does not is
an error, not a figure.
"""

from __future__ import annotations

import argparse
import calendar
import os
import re
import signal
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
from sglang_sim.testing import SimProcess, start_sim

REPO = Path(__file__).resolve().parent.parent
SIM = ["--sim-profile", "fast", "--time-scale", "0.2", "--sim-startup-s", "0", "--sim-output-mean", "160",
       "--sim-output-spread", "0.6", "--max-total-tokens", "20000"]
TARGET, FREEZE_AT = 300, 30
TOOK = re.compile(r"^(\S+Z) WARNING took (\S+) out after no progress for ([\d.]+) s on (\d+) in-flight", re.M)


def _dataset(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}: tell me about topic {i % 17}."}]}
            for i in range(TARGET + 40)]
    (folder / "H.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    toml = folder / "H.toml"
    toml.write_text(f"""name = "H"
target_samples = {TARGET}
[source]
files = ["H.jsonl"]
schema = "messages"
field = "messages"
id_field = "id"
[sampling]
max_new_tokens = 64
temperature = 0.7
top_p = 0.95
[generation]
reasoning = "keep"
truncated = "keep"
request_timeout_s = 600
""")
    return toml


def _lines(folder: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("shard-*.jsonl"))


def _seen(client: httpx.Client, sims: list[SimProcess]) -> int:
    return sum(int(client.get(s.url + "/sim/stats").json()["requests_seen"]) for s in sims)


def _utc(stamp: str) -> float:
    whole, ms = stamp.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000


def trial(work: Path) -> dict[str, Any]:
    toml, out = _dataset(work / "ds"), work / "out"
    with start_sim(SIM) as a, start_sim(SIM) as b, start_sim(SIM) as hung, httpx.Client(timeout=5) as client:
        cmd = [sys.executable, "-m", "gen_pipeline", "generate", "--dataset", str(toml), "--server-url",
               f"{a.url},{b.url},{hung.url}", "--output-dir", str(out), "--progress", "quiet"]
        with open(work / "cli.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            while not (out / "H").is_dir() or _lines(out / "H") < FREEZE_AT:
                if proc.poll() is not None:
                    raise RuntimeError(f"generate ended early: {(work / 'cli.log').read_text()[-2000:]}")
                time.sleep(0.01)
            os.killpg(hung.process.pid, signal.SIGSTOP)
            frozen_at, polls = time.time(), []
            while proc.poll() is None and time.time() - frozen_at < 60:
                polls.append((time.time(), _seen(client, [a, b])))
                time.sleep(0.01)
            rc = proc.wait(timeout=300)
        finally:
            os.killpg(hung.process.pid, signal.SIGCONT)
            if proc.poll() is None:
                proc.kill()
    run_log = (out / "H" / "run.log").read_text()
    took = TOOK.search(run_log)
    shards = sorted((out / "H").glob("shard-*.jsonl"))
    ids = [orjson.loads(x)["id"] for p in shards for x in p.read_bytes().splitlines()]
    if rc != 0 or took is None or len(ids) != TARGET or len(set(ids)) != TARGET:
        raise RuntimeError(f"trial not exact (rc {rc}, {len(ids)} lines, {len(set(ids))} ids): {run_log[-2000:]}")
    resent, took_at = int(took.group(4)), _utc(took.group(1))
    # nothing is re-sent before the take-out; the run's own refills can come in bursts too
    burst = _burst([(t, n) for t, n in polls if t >= took_at - 0.05], resent / 2)
    return {"taken_out_s": round(took_at - frozen_at, 2),
            "resent_s": round(burst - frozen_at, 2) if burst is not None else None,
            "silence_s": float(took.group(3)), "resent": resent}


def _burst(polls: list[tuple[float, int]], at_least: float, within_s: float = 0.05) -> float | None:
    """When the count first rose by `at_least` within `within_s` (polls: (time, cumulative count))."""
    first = 0
    for t, n in polls:
        while polls[first][0] < t - within_s:
            first += 1
        if n - polls[first][1] >= at_least:
            return t
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.hang_bench")
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args(argv or [])
    trials = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
            trials.append(trial(Path(tmp)))
        print(f"trial {i + 1}: {trials[-1]}", flush=True)
    med = {k: statistics.median(t[k] for t in trials if t[k] is not None)
           for k in ("taken_out_s", "resent_s", "silence_s")}
    rows = [[i + 1, t["taken_out_s"], t["resent_s"], t["silence_s"], t["resent"]] for i, t in enumerate(trials)]
    rows.append(["median", med["taken_out_s"], med["resent_s"], med["silence_s"], ""])
    table = md_table(["trial", "SIGSTOP → taken out (s)", "SIGSTOP → re-sent (s)", "silence the tool measured (s)",
                      "requests re-sent"], rows)
    print(table)
    write_section("hang", {"trials": trials, "median": med, "settings": {
        "health_interval_s": 5.0, "hang_timeout_s": 5.0, "servers": 3, "target": TARGET, "sim": SIM}},
        "## A hung fleet member (`python -m bench hang`)\n\n"
        "1 of 3 simulators SIGSTOPped once 30 of 300 samples are written, the shipped defaults "
        "(--health-interval-s 5, --hang-timeout-s 5, request_timeout_s 600); bench/hang_bench.py says how each "
        "time is read. Every trial ended exact (300 samples, 0 duplicates). Before hung servers were detected (same "
        "scenario, tests/server/test_outage.py) the server was taken out after 44 s of silence (two 20 s /health "
        "timeouts).\n\n" + table)


if __name__ == "__main__":
    main(sys.argv[1:])
