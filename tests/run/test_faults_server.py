"""Server faults through the simulator: each run ends exact, or with its failures in errors.jsonl, retried
by the next run."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from pipeline_helpers import SIM_FAST, assert_exact, make_rows, run_cli, sim_profile, write_dataset

NO_FAULTS = {"error_rate": 0.0, "error_status": 500, "429_rate": 0.0, "stall_rate": 0.0, "cut_rate": 0.0,
             "bad_json_rate": 0.0, "wrong_content_type_rate": 0.0, "no_usage_rate": 0.0, "crash_after": 0}


@pytest.fixture(scope="module")
def sim():
    with sim_in_thread(SIM_FAST, ready_timeout_s=30) as s:
        yield s


def set_faults(url: str, **faults: float) -> None:
    r = httpx.post(url + "/sim/faults", json={**NO_FAULTS, **faults}, timeout=5)
    assert r.status_code == 200, r.text


def fault_count(url: str, kind: str) -> int:
    return httpx.get(url + "/sim/stats", timeout=5).json()["faults"][kind]


def dataset(folder: Path, *, timeout_s: float = 20, max_attempts: int = 8, rows: int = 80) -> Path:
    toml = write_dataset(folder, target=60, max_new_tokens=64, shard_max_samples=16, fsync_every=4,
                         rows=make_rows(rows))
    text = toml.read_text().replace("request_timeout_s = 20", f"request_timeout_s = {timeout_s}")
    toml.write_text(text.replace("max_attempts = 8", f"max_attempts = {max_attempts}"))
    return toml


def generate(toml: Path, out: Path, *where: str):
    return run_cli("generate", "--dataset", toml, *where, "--output-dir", out, "--progress", "quiet")


def errors(out: Path) -> list[dict]:
    path = out / "T" / "errors.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


@pytest.mark.parametrize(("kind", "faults", "timeout_s", "hits"), [
    ("error", {"error_rate": 0.3}, 20, 5),
    ("error", {"error_rate": 0.3, "error_status": 503}, 20, 5),
    ("429", {"429_rate": 0.3}, 20, 5),
    ("cut", {"cut_rate": 0.3}, 20, 5),
    ("bad_json", {"bad_json_rate": 0.3}, 20, 5),
    ("wrong_content_type", {"wrong_content_type_rate": 0.3}, 20, 5),
    ("no_usage", {"no_usage_rate": 0.3}, 20, 5),
    ("stall", {"stall_rate": 0.15, "stall_s": 4.0}, 1.0, 3),  # stalled answers time out and are retried
], ids=["error", "error-503", "429", "cut", "bad_json", "wrong_content_type", "no_usage", "stall"])
def test_response_faults_end_exact(tmp_path: Path, sim, kind: str, faults: dict, timeout_s: float, hits: int) -> None:
    before = fault_count(sim.url, kind)
    set_faults(sim.url, **faults)
    try:
        r = generate(dataset(tmp_path / "ds", timeout_s=timeout_s), tmp_path / "out", "--server-url", sim.url)
    finally:
        set_faults(sim.url)
    assert fault_count(sim.url, kind) - before >= hits  # the faults did hit this run
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("T: 60/60 samples (100.0%), +60 this run in ")
    assert_exact(tmp_path / "out", 60)


def test_exhausted_retries_are_recorded_and_retried_next_run(tmp_path: Path, sim) -> None:
    toml = dataset(tmp_path / "ds", max_attempts=2, rows=60)
    out = tmp_path / "out"
    set_faults(sim.url, error_rate=0.35, seed=7)
    try:
        first = generate(toml, out, "--server-url", sim.url)
    finally:
        set_faults(sim.url)
    assert first.returncode == 0, first.stderr
    failed = errors(out)
    assert failed, first.stdout
    assert {e["reason"] for e in failed} == {"http_500"}, failed
    assert all(e["retryable"] is True and e["run"] == 1 and e["attempts"] == 2 and
               e["detail"].startswith("gave up after 2 attempts: ") for e in failed)
    n = len(failed)  # the summary counts them, none final
    assert first.stdout.strip().splitlines()[-1].endswith(
        f", {n} failed (http_500 {n}; 0 final, {n} retried by the next run); the source has no more prompts; run "
        "again to retry the failed ones.")
    second = generate(toml, out, "--server-url", sim.url)
    assert second.returncode == 0, second.stderr
    ids = {s["id"] for s in assert_exact(out, 60)}
    assert {e["id"] for e in failed} <= ids


# the launched simulator: fast, half a second to start
BASE = ["--sim-profile", "fast", "--time-scale", "10", "--sim-startup-s", "0.5", "--sim-output-mean", "160",
        "--sim-output-spread", "0.6"]


@pytest.mark.e2e  # the launcher restarting its server process (a real-time /health window): make e2e
@pytest.mark.parametrize(("sim_args", "window", "said"), [
    (["--sim-crash-after", "25"], [],
     ["SGLang exited with code 1; dispatch paused", "restarting SGLang in 0.5 s (restart 1 of 3)"]),
    # /health answers 503 from 0.5 s to 3 s after each start; stalls keep the run going past that window
    (["--sim-health-503-after-s", "0.5", "--sim-health-503-for-s", "2.5", "--sim-stall-rate", "0.5",
      "--sim-stall-s", "0.5"], ["--window", "4"],
     ["SGLang failed 3 health checks in a row; dispatch paused", "SGLang is back (restart 1)"]),
], ids=["crash", "health-flapping"])
def test_a_server_that_crashes_or_fails_health_checks_is_restarted_and_the_run_completes(
        tmp_path: Path, sim_args: list[str], window: list[str], said: list[str]) -> None:
    cfg = sim_profile(tmp_path, "faulty", BASE + sim_args)
    out = tmp_path / "out"
    r = generate(dataset(tmp_path / "ds"), out, "--server", "faulty", "--config-dir", cfg, *window)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(out, 60)
    for line in said:
        assert line in r.stdout, r.stdout
