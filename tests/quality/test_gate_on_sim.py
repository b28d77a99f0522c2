"""The gate against a simulator that loops or ends turns at once: every loop caught within ABORT_WITHIN tokens of
its start (/sim/stats "loops"), `on_loop` and `empty_turn` honoured with exact counts where users read them."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import orjson
import pytest
from servers import sim_in_thread

from gen_pipeline.config.dataset import load_dataset_config
from gen_pipeline.errors import ConfigError

from pipeline_helpers import SIM_FAST, assert_exact, make_rows, read_samples, run_cli, write_dataset

ROWS = 30
MAX_NEW = 4096  # a loop not caught would run to it
ABORT_WITHIN = 512  # tokens past the loop's first token, when the client closed the stream
CAUGHT = re.compile(r"loop caught in \S+: request (\w+): .*?; aborted after (\d+) tokens")


@pytest.fixture(scope="module")
def sim():
    # with a reasoning parser, as the reference job's server (without one every answer has think markers)
    # time scale 2 (~1 ms a decode step): a loop caught ~400 tokens in still has ~3.7 s of decoding to go
    # when the client hangs up, so the abort lands before the cap however busy the machine is
    args = [*SIM_FAST, "--time-scale", "2", "--reasoning-parser", "kimi_k2", "--sim-loop-rate", "0.2",
            "--sim-seed", "5"]
    with sim_in_thread(args, ready_timeout_s=30) as s:
        yield s


def _stats(url: str) -> dict:
    return httpx.get(url + "/sim/stats", timeout=5).json()


def _errors(out: Path) -> list[dict]:
    path = out / "T" / "errors.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _run(url: str, toml: Path, out: Path):
    return run_cli("generate", "--dataset", toml, "--server-url", url, "--output-dir", out, "--progress", "quiet")


def _generate(sim, policy: str, tmp_path: Path, rc: int | None = 0) -> tuple[Path, Path, list[dict], str]:
    """One run; the loops the sim wrote during it (each checked: aborted within ABORT_WITHIN)."""
    toml, out = write_dataset(tmp_path / "ds", target=ROWS, max_new_tokens=MAX_NEW, shard_max_samples=16, fsync_every=4,
                              rows=make_rows(ROWS), extra=f'on_loop = "{policy}"'), tmp_path / "out"
    before = len(_stats(sim.url)["loops"])
    r = _run(sim.url, toml, out)
    rc = (5 if _errors(out) else 0) if rc is None else rc  # 5: rows dropped, the source ran out short of the target
    assert r.returncode == rc, r.stdout + r.stderr
    loops = _stats(sim.url)["loops"][before:]
    assert loops, "the sim wrote no loop in this run"
    # run.log's line per loop caught: the server's request id and the tokens the client had seen
    caught = {m[1]: int(m[2]) for m in CAUGHT.finditer((out / "T" / "run.log").read_text())}
    assert sorted(caught) == sorted(x["rid"] for x in loops)  # every loop caught, nothing else
    late = [x for x in loops if x["finish_reason"] != "abort"
            or not x["loop_start"] < caught[x["rid"]] <= x["loop_start"] + ABORT_WITHIN
            or x["decoded"] < caught[x["rid"]]]
    assert late == [], (late, caught)
    return toml, out, loops, r.stdout


def _turns(samples: list[dict]) -> list[dict]:
    return [t for s in samples for t in s["meta"]["per_turn"]]


def test_retry_writes_every_sample_with_a_new_seed(sim, tmp_path):
    toml, out, loops, stdout = _generate(sim, "retry", tmp_path)
    samples = assert_exact(out, ROWS)
    assert _errors(out) == []
    turns = _turns(samples)
    assert sum(t["loops"] for t in turns) == len(loops)  # every loop the sim wrote, accounted once
    assert all(t["attempts"] == 1 + t["loops"] + t["empty"] for t in turns)
    assert all(t["finish_reason"] in ("stop", "length") for t in turns)
    # counted from the tokens the client had seen when it closed the stream (the server decodes a few more
    # until the abort lands: how many depends on the machine's load)
    not_decoded = sum(t["tokens_not_decoded"] for t in turns)
    assert not_decoded >= sum(MAX_NEW - x["decoded"] for x in loops)
    assert sum(t["empty"] for t in turns) == 0  # no other fault in this sim: every discarded token is a loop's
    discarded = sum(t["discarded_tokens"] for t in turns)
    assert discarded + not_decoded == MAX_NEW * len(loops)
    n = len(loops)
    gate = (f"quality gate: {n:,} loop{'' if n == 1 else 's'} caught, 0 empty answers retried, 0 leaks flagged; "
            f"{not_decoded:,} tokens not decoded")
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"  {gate}, {discarded:,} decoded and discarded (written rows only" in v.stdout, v.stdout
    st = run_cli("status", "--dataset", "T", "--output-dir", out, "--config-dir", toml.parent)
    assert st.returncode == 0, st.stdout + st.stderr
    assert f"T: {gate} (~" in st.stdout, st.stdout
    assert f" server-s saved), {discarded:,} decoded and discarded" in st.stdout, st.stdout
    js = orjson.loads(run_cli("status", "--dataset", "T", "--output-dir", out, "--config-dir", toml.parent,
                              "--json").stdout)["datasets"]["T"]
    assert js["gate"]["loops"] == n and js["gate"]["tokens_not_decoded"] == not_decoded
    assert js["gate"]["retried_turns"] <= n  # a turn may loop twice
    # the estimate: tokens not decoded × the run's server-seconds per decoded token
    per_token = js["run_wall_s"] / (js["completion_tokens"] + discarded)
    assert js["server_s_saved"] == pytest.approx(not_decoded * per_token, abs=0.1)
    # the dataset card beside an export: GPUs as the run recorded them (tp 1 x dp 1 x 1 server)
    e = run_cli("export", "--output-dir", out, "--dataset", "T", "--format", "speculators", "--out",
                tmp_path / "x.jsonl")
    assert e.returncode == 0, e.stdout + e.stderr
    card = (tmp_path / "README.md").read_text()
    assert re.search(rf"\| T \| {n:,} \| 0 \| 0 \| 0 \| {not_decoded:,} \| \d+\.\d\d \|",
                     card.split("## Quality gate")[1]), card


def test_drop_fails_the_sample_at_once(sim, tmp_path):
    toml, out, loops, stdout = _generate(sim, "drop", tmp_path, rc=5)
    failed = _errors(out)
    assert len(failed) == len(loops)  # one loop drops its sample: one failure per loop
    n = len(loops)
    assert (f"T: {ROWS - n}/{ROWS} samples ({100 * (ROWS - n) / ROWS:.1f}%), +{ROWS - n} this run in "
            in stdout), stdout
    assert f"{n} failed (loop {n}; {n} final, 0 retried by the next run)" in stdout
    assert {(e["reason"], e["retryable"]) for e in failed} == {("loop", False)}
    assert all(e["attempts"] >= 1 and e["loops"] == 1 for e in failed)
    samples = read_samples(out)
    assert len(samples) == ROWS - len(failed)
    assert not {e["id"] for e in failed} & {s["id"] for s in samples}
    assert all(t["loops"] == 0 for t in _turns(samples))
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "loops caught" not in v.stdout  # the written rows had none: the failures hold them
    js = orjson.loads(run_cli("status", "--dataset", "T", "--output-dir", out, "--config-dir", toml.parent,
                              "--json").stdout)["datasets"]["T"]
    assert js["gate"]["loops"] == n and js["errors_unresolved"] == n
    assert js["gate"]["tokens_not_decoded"] == sum(e["tokens_not_decoded"] for e in failed) > 0


def test_keep_cuts_the_turn_where_the_loop_began(sim, tmp_path):
    toml, out, loops, stdout = _generate(sim, "keep", tmp_path, rc=None)
    samples, failed = read_samples(out), _errors(out)
    kept = [t for t in _turns(samples) if t["finish_reason"] == "loop"]
    # a loop that began before any answer leaves nothing to keep: a final failure, reason loop
    assert len(kept) + len(failed) == len(loops) and kept
    assert {(e["reason"], e["retryable"]) for e in failed} <= {("loop", False)}
    assert len(samples) == ROWS - len(failed)
    assert all(t["loops"] == 1 and t["attempts"] == 1 for t in kept)
    looped = [s for s in samples if s["meta"]["finish_reason"] == "loop"]
    assert len(looped) == len(kept)
    for s in looped:  # the cut turn is the last one: the conversation ends there
        assert s["conversations"][-1]["role"] == "assistant" and s["conversations"][-1]["content"].strip()
        assert s["meta"]["per_turn"][-1]["finish_reason"] == "loop"
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.parametrize("key, choices", [("on_loop", "'retry', 'drop', 'keep', 'off'"),
                                         ("empty_turn", "'retry', 'fail'")])
def test_an_unknown_policy_is_a_config_error(tmp_path, key: str, choices: str):
    toml = write_dataset(tmp_path / "ds", extra=f'{key} = "maybe"')
    with pytest.raises(ConfigError) as e:
        load_dataset_config(toml)
    assert str(e.value) == f"{toml}: generation.{key} = 'maybe' is not one of {choices}."


# ---------------------------------------------------------------- a model that ends its turn at once

@pytest.fixture(scope="module")
def empty_sim():
    with sim_in_thread([*SIM_FAST, "--sim-empty-turn-rate", "0.25", "--sim-seed", "3"], ready_timeout_s=30) as s:
        yield s


def _empty_dataset(folder: Path, policy: str | None, rows: int = 60) -> Path:
    return write_dataset(folder, target=40, max_new_tokens=64, shard_max_samples=16, fsync_every=4,
                         rows=make_rows(rows), extra=f'empty_turn = "{policy}"' if policy else "")


@pytest.mark.parametrize("policy", [None, "fail"])
def test_empty_turns_are_retried_by_default_or_fail_at_once(tmp_path, empty_sim, policy: str | None):
    toml, out = _empty_dataset(tmp_path / "ds", policy), tmp_path / "out"
    before = _stats(empty_sim.url)["faults"]["empty_turn"]
    r = _run(empty_sim.url, toml, out)
    assert r.returncode == 0, r.stdout + r.stderr
    samples = assert_exact(out, 40)  # 60 prompts: the target is met past any failed ones
    assert all(t["content"].strip() for s in samples for t in s["conversations"])
    failed = _errors(out)
    if policy is None:
        assert _stats(empty_sim.url)["faults"]["empty_turn"] - before >= 5  # the model did end turns at once
        assert failed == []
    else:
        assert failed and {(e["reason"], e["retryable"]) for e in failed} == {("empty_turn", False)}
        assert all(e["detail"].startswith("the assistant turn is empty (1 completion tokens, finish_reason stop)")
                   for e in failed)
        assert not {e["id"] for e in failed} & {s["id"] for s in samples}
    v = run_cli("validate", "--dataset", toml, "--output-dir", out)
    assert v.returncode == 0, v.stdout + v.stderr


def test_retries_spent_record_a_retryable_failure(tmp_path, empty_sim):
    toml, out = _empty_dataset(tmp_path / "ds", "retry", rows=40), tmp_path / "out"
    toml.write_text(toml.read_text().replace("max_attempts = 8", "max_attempts = 2"))
    httpx.post(empty_sim.url + "/sim/faults", json={"empty_turn_rate": 1.0}, timeout=5).raise_for_status()
    try:
        r = _run(empty_sim.url, toml, out)
    finally:
        httpx.post(empty_sim.url + "/sim/faults", json={"empty_turn_rate": 0.25}, timeout=5).raise_for_status()
    failed = _errors(out)
    assert len(failed) == 40 and read_samples(out, "T") == []
    assert r.returncode == 0, r.stderr  # as for any retryable failure: the next run retries them
    assert "40 failed (empty_turn 40; 0 final, 40 retried by the next run)" in r.stdout
    assert {(e["reason"], e["retryable"]) for e in failed} == {("empty_turn", True)}
    assert all(e["detail"].startswith("gave up after 2 attempts: the assistant turn is empty") for e in failed)
    assert "Traceback" not in r.stderr
