"""Fault soak (issue 5): break the run on purpose, many times, and count samples lost and duplicated.

    python -m bench.faults_soak [--kill-trials 25] [--iterations 3]

Kinds: SIGKILL of the CLI at seeded moments (aimed at writes, shard rotation, manifest commits),
SIGINT/SIGTERM, every simulator response fault, a server crash and /health flapping under the
launcher, ENOSPC/EIO in
the store's file layer. Each iteration ends with a resume to the target on a fresh output folder;
lost = target - unique ids, duplicated = lines - unique ids. Writes the "faults" bench section.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import anyio
import httpx

from bench.report import md_table, write_section
from gen_pipeline.config.dataset import find_dataset_config
from gen_pipeline.errors import DiskError
from gen_pipeline.run import RunOptions, run_generate
from sglang_sim.testing import start_sim

from pipeline_helpers import (
    SIM_FAST,
    _shard_lines,
    count_output,
    kill_resume_trial,
    run_cli,
    start_cli,
    wait_for,
    write_dataset,
)

TARGET = 60
RESPONSE_FAULTS = {"5xx (500)": {"error_rate": 0.3}, "5xx (503)": {"error_rate": 0.3, "error_status": 503},
                   "429": {"429_rate": 0.3}, "cut mid-body": {"cut_rate": 0.3},
                   "malformed JSON": {"bad_json_rate": 0.3},
                   "wrong content type": {"wrong_content_type_rate": 0.3}, "usage missing": {"no_usage_rate": 0.3},
                   "stalled (timeout 1 s)": {"stall_rate": 0.15, "stall_s": 4.0}}
NO_FAULTS = {"error_rate": 0.0, "error_status": 500, "429_rate": 0.0, "stall_rate": 0.0, "cut_rate": 0.0,
             "bad_json_rate": 0.0, "wrong_content_type_rate": 0.0, "no_usage_rate": 0.0}


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, int]] = {}

    def add(self, kind: str, out: Path, *, faults_hit: int = 0) -> None:
        lines, unique, bad = count_output(out)
        row = self.rows.setdefault(kind, {"iterations": 0, "faults_hit": 0, "lost": 0, "duplicated": 0,
                                          "unparseable": 0})
        row["iterations"] += 1
        row["faults_hit"] += faults_hit
        row["lost"] += max(0, TARGET - unique)
        row["duplicated"] += lines - bad - unique
        row["unparseable"] += bad
        print(f"  {kind}: {unique}/{TARGET} unique, {lines - bad - unique} dup, {bad} bad", flush=True)


def _args(toml: Path, out: Path, url: str) -> tuple:
    return ("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "quiet")


def soak_sigkill(tally: Tally, url: str, work: Path, trials: int) -> None:
    for seed in range(trials):
        r = kill_resume_trial(work / f"kill{seed}", url, 1000 + seed, kills=2, target=TARGET)
        tally.add("SIGKILL (CLI)", r["out"], faults_hit=r["landed"])


def soak_signal(tally: Tally, url: str, work: Path, sig: int, n: int) -> None:
    for i in range(n):
        toml = write_dataset(work / f"{sig}-{i}/ds", target=TARGET, max_new_tokens=64, shard_max_samples=7,
                             fsync_every=3)
        out = work / f"{sig}-{i}/out"
        proc = start_cli(*_args(toml, out, url), "--window", "4", "--drain-grace-s", "10", log=work / "sig.log")
        # wait_for calls the predicate before this iteration ends, so the loop variables are current
        wait_for(lambda: (out / "T").is_dir() and _shard_lines(out / "T") >= 5 + 3 * i,  # noqa: B023
                 timeout_s=60, interval_s=0.005)
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        run_cli(*_args(toml, out, url))
        tally.add(signal.Signals(sig).name, out, faults_hit=int(code == 128 + sig))


def _hits(url: str) -> int:
    faults = httpx.get(url + "/sim/stats", timeout=5).json()["faults"]
    return sum(v for k, v in faults.items() if k != "none")


def soak_response_faults(tally: Tally, url: str, work: Path, n: int) -> None:
    for kind, faults in RESPONSE_FAULTS.items():
        for i in range(n):
            toml = write_dataset(work / f"{kind}-{i}/ds", target=TARGET, max_new_tokens=64, shard_max_samples=16)
            toml.write_text(toml.read_text().replace("request_timeout_s = 20", "request_timeout_s = 1")
                            if "stall_rate" in faults else toml.read_text())
            out = work / f"{kind}-{i}/out"
            before = _hits(url)
            httpx.post(url + "/sim/faults", json={**NO_FAULTS, **faults, "seed": i}, timeout=5)
            try:
                run_cli(*_args(toml, out, url))
            finally:
                httpx.post(url + "/sim/faults", json=NO_FAULTS, timeout=5)
            hit = _hits(url) - before
            run_cli(*_args(toml, out, url))  # the resume that retries recorded failures (a no-op when complete)
            tally.add(kind, out, faults_hit=hit)


LAUNCHED = {  # kind → (simulator flags of a server.toml profile, extra CLI flags)
    "server crash (supervised restart)": (["--sim-crash-after", "{crash_after}"], []),
    "health flapping (503 for 2.5 s)": (["--sim-health-503-after-s", "0.5", "--sim-health-503-for-s", "2.5",
                                        "--sim-stall-rate", "0.5", "--sim-stall-s", "0.5"], ["--window", "4"]),
}
_SIM_BASE = ["--sim-profile", "fast", "--time-scale", "10", "--sim-startup-s", "0.5", "--sim-output-mean", "160",
             "--sim-output-spread", "0.6"]


def soak_launched(tally: Tally, work: Path, n: int) -> None:
    """Faults of a launched server: the supervisor restarts it; count the restarts it announced."""
    import orjson
    repo = Path(__file__).resolve().parent.parent
    for k, (kind, (sim_flags, cli_flags)) in enumerate(LAUNCHED.items()):
        for i in range(n):
            folder = work / f"launched{k}-{i}"
            (folder / "cfg").mkdir(parents=True)
            flags = [f.format(crash_after=20 + 5 * i) for f in _SIM_BASE + sim_flags]
            (folder / "cfg" / "server.toml").write_text((repo / "datasets_cfg" / "server.toml").read_text()
                                                        + '\n[profile.faulty]\ninherits = "sim"\n'
                                                        + f"extra_args = {orjson.dumps(flags).decode()}\n")
            toml = write_dataset(folder / "ds", target=TARGET, max_new_tokens=64)
            r = run_cli("generate", "--dataset", toml, "--server", "faulty", "--config-dir", folder / "cfg",
                        "--output-dir", folder / "out", "--progress", "quiet", *cli_flags)
            tally.add(kind, folder / "out", faults_hit=r.stdout.count("dispatch paused"))


def soak_disk(tally: Tally, url: str, work: Path, n: int) -> None:
    from tests.store.store_helpers import FullDisk as opener
    for code in (errno.ENOSPC, errno.EIO):
        for i in range(n):
            toml = write_dataset(work / f"disk{code}-{i}/ds", target=TARGET, max_new_tokens=64, shard_max_samples=7,
                                 fsync_every=3)
            cfg, out = find_dataset_config(str(toml)), work / f"disk{code}-{i}/out"
            opts = RunOptions(output_root=out, server_urls=(url,), window=4,
                              file_opener=opener(4_000 + 6_000 * i, code))
            hit = 0
            try:
                anyio.run(run_generate, cfg, opts)
            except DiskError:
                hit = 1
            resume = RunOptions(output_root=out, server_urls=(url,))
            anyio.run(run_generate, cfg, resume)
            tally.add(f"disk {errno.errorcode[code]}", out, faults_hit=hit)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kill-trials", type=int, default=25, help="SIGKILL trials (2 kills + resume each)")
    p.add_argument("--iterations", type=int, default=3, help="iterations per other fault kind")
    a = p.parse_args(argv)
    tally, started = Tally(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-soak-") as tmp, start_sim(SIM_FAST, ready_timeout_s=30) as sim:
        work = Path(tmp)
        soak_sigkill(tally, sim.url, work, a.kill_trials)
        for sig in (signal.SIGINT, signal.SIGTERM):
            soak_signal(tally, sim.url, work, sig, a.iterations)
        soak_response_faults(tally, sim.url, work, a.iterations)
        soak_disk(tally, sim.url, work, a.iterations)
        soak_launched(tally, work, a.iterations)
    report(tally, time.monotonic() - started)


def report(tally: Tally, elapsed_s: float) -> None:
    rows = [[k, v["iterations"], v["faults_hit"], v["lost"], v["duplicated"], v["unparseable"]]
            for k, v in tally.rows.items()]
    md = ("## Fault soak (`python -m bench.faults_soak`)\n\n"
          f"Target {TARGET} samples per iteration, simulator profile \"fast\"; every iteration ends with a resume "
          f"on the same output folder. {elapsed_s:.0f} s wall.\n"
          "An iteration is one faulted run plus its resume (SIGKILL: two kills, then the resume). "
          "faults hit: SIGKILLs that landed mid-run / signals answered with 130|143 / simulator faults served / "
          "DiskErrors raised / restarts of a launched server (\"dispatch paused\" events). "
          "Goal: lost 0, duplicated 0.\n\n"
          + md_table(["fault", "iterations", "faults hit", "samples lost", "samples duplicated", "unparseable lines"],
                     rows))
    write_section("faults", {"target_per_iteration": TARGET, "elapsed_s": round(elapsed_s, 1), "kinds": tally.rows},
                  md)
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
