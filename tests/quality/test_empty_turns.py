"""A model that ends its turn at once: an empty assistant turn is never written as done; `[generation]
empty_turn` retries it (then records a failure) or fails it at once; `validate` passes either way."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from pipeline_helpers import SIM_FAST, assert_exact, make_rows, read_samples, run_cli, write_dataset


@pytest.fixture(scope="module")
def sim():
    with sim_in_thread([*SIM_FAST, "--sim-empty-turn-rate", "0.25", "--sim-seed", "3"], ready_timeout_s=30) as s:
        yield s


def _dataset(folder: Path, policy: str | None, rows: int = 60) -> Path:
    toml = write_dataset(folder, target=40, max_new_tokens=64, shard_max_samples=16, fsync_every=4,
                         rows=make_rows(rows))
    if policy is not None:
        toml.write_text(toml.read_text().replace("[generation]\n", f'[generation]\nempty_turn = "{policy}"\n'))
    return toml


def _empty_faults(url: str) -> int:
    return httpx.get(url + "/sim/stats", timeout=5).json()["faults"]["empty_turn"]


def _errors(out: Path) -> list[dict]:
    path = out / "T" / "errors.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _validate(toml: Path, out: Path):
    return run_cli("validate", "--dataset", toml, "--output-dir", out)


def test_empty_turns_are_retried_by_default(tmp_path, sim):
    toml, out = _dataset(tmp_path / "ds", None), tmp_path / "out"
    before = _empty_faults(sim.url)
    r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _empty_faults(sim.url) - before >= 5  # the model did end turns at once in this run
    samples = assert_exact(out, 40)
    assert all(t["content"].strip() for s in samples for t in s["conversations"])
    assert _errors(out) == []
    v = _validate(toml, out)
    assert v.returncode == 0, v.stdout + v.stderr


def test_empty_turns_fail_at_once_when_configured(tmp_path, sim):
    toml, out = _dataset(tmp_path / "ds", "fail"), tmp_path / "out"
    r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out, "--progress", "quiet")
    failed = _errors(out)
    assert failed, r.stdout
    assert {(e["reason"], e["retryable"]) for e in failed} == {("empty_turn", False)}
    assert all(e["detail"].startswith("the assistant turn is empty (1 completion tokens, finish_reason stop)")
               for e in failed)
    assert r.returncode == 0, r.stdout + r.stderr
    samples = assert_exact(out, 40)  # 60 prompts: the target is met past the failed ones
    assert not {e["id"] for e in failed} & {s["id"] for s in samples}
    v = _validate(toml, out)
    assert v.returncode == 0, v.stdout + v.stderr


def test_retries_spent_record_a_retryable_failure(tmp_path, sim):
    toml, out = _dataset(tmp_path / "ds", "retry", rows=40), tmp_path / "out"
    toml.write_text(toml.read_text().replace("max_attempts = 8", "max_attempts = 2"))
    httpx.post(sim.url + "/sim/faults", json={"empty_turn_rate": 1.0}, timeout=5).raise_for_status()
    try:
        r = run_cli("generate", "--dataset", toml, "--server-url", sim.url, "--output-dir", out,
                    "--progress", "quiet")
    finally:
        httpx.post(sim.url + "/sim/faults", json={"empty_turn_rate": 0.25}, timeout=5).raise_for_status()
    failed = _errors(out)
    assert len(failed) == 40 and read_samples(out, "T") == []
    assert r.returncode == 0, r.stderr  # as for any retryable failure: the next run retries them
    assert "40 failed (empty_turn 40; 0 final, 40 retried by the next run)" in r.stdout
    assert {(e["reason"], e["retryable"]) for e in failed} == {("empty_turn", True)}
    assert all(e["detail"].startswith("gave up after 2 attempts: the assistant turn is empty") for e in failed)
    assert "Traceback" not in r.stderr
