"""The dataset card's figures and what the export says about itself: shares over the exported samples,
GPU-hours over the store's samples, leak failures counted, per-turn flags kept."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from datasets import load_from_disk
from export_helpers import export_here, write_store
from servers import SimThread

from gen_pipeline.cli import main
from gen_pipeline.quality.accounting import add_failure
from gen_pipeline.records import Failure, Sample

from pipeline_helpers import make_rows, write_dataset


def _turn_meta(finish: str, leak: str = "") -> dict:
    return {"finish_reason": finish, "prompt_tokens": 5, "completion_tokens": 9, "reasoning_tokens": 3,
            "attempts": 2 if leak else 1, "loops": 0, "empty": 0, "leak": leak, "tokens_not_decoded": 0,
            "discarded_tokens": 0} | ({"spec_accept_length": 2.25, "spec_verify_ct": 4} if leak else {})


def _store(root: Path) -> Path:
    """10 samples, S-0 and S-1 truncated, S-5's turn flagged as a leak; one leak failure."""
    samples = []
    for i in range(10):
        finish = "length" if i < 2 else "stop"
        samples.append(Sample(f"S-{i}", "S", [{"role": "user", "content": f"q {i}"},
                                              {"role": "assistant", "content": f"answer {i}",
                                               "reasoning_content": f"think {i}"}],
                              {"model": "m", "backend": "sim", "finish_reason": finish, "prompt_tokens": 5,
                               "completion_tokens": 9, "turns": 1, "sampling": {"temperature": 0.7},
                               "kv_cache_dtype": "fp8_e4m3", "generated_at": "x", "chat_template_kwargs": "{}",
                               "per_turn": [_turn_meta(finish, "think_marker" if i == 5 else "")]}))
    return write_store(root, "S", samples, [Failure("S-x", "S", "leak", "think_marker: the answer holds <think>",
                                                    attempts=1, retryable=False)])


def test_the_truncated_share_is_over_the_exported_samples_and_hf_keeps_the_per_turn_flags(tmp_path: Path) -> None:
    root = _store(tmp_path / "out")
    out = tmp_path / "e" / "s.jsonl"
    assert export_here(root, "--dataset", "S", "--format", "specforge", "--out", out, "--drop-truncated") == 0
    card = (out.parent / "README.md").read_text()
    assert "| S | 10 | 2 truncated | 8 | 0.0% |" in card
    # the leak failure counts beside the written turn's flag
    assert re.search(r"^\| S \| 0 \| 0 \| 0 \| 2 \| 0 \| ", card, re.M), card
    out = tmp_path / "hf"
    assert export_here(root, "--dataset", "S", "--format", "hf", "--out", out) == 0
    by_id = {r["id"]: r["meta"] for r in load_from_disk(str(out))["train"]}
    # S-5's turn also carries a draft's acceptance (a server with a speculative algorithm): kept, typed
    assert by_id["S-5"]["per_turn"] == [_turn_meta("stop", "think_marker")]
    assert by_id["S-0"]["per_turn"][0]["finish_reason"] == "length"
    assert (by_id["S-0"]["per_turn"][0]["spec_accept_length"], by_id["S-0"]["per_turn"][0]["spec_verify_ct"]) == \
        (None, None)
    assert by_id["S-5"]["chat_template_kwargs"] == "{}"


def test_leak_failures_count_as_leaks() -> None:
    counts: dict[str, int] = {}
    for row in ({"reason": "leak", "detail": "think_marker: x"},
                {"reason": "truncated", "detail": "cut_in_reasoning: the thinking was cut"},
                {"reason": "truncated", "detail": "turn 1 hit max_new_tokens=512"}, {"reason": "loop"}):
        add_failure(counts, row)
    assert counts == {"leaks": 2}


def test_gpu_hours_count_the_stores_samples_after_a_kill(shared_sim: SimThread, tmp_path: Path) -> None:
    """A run killed (kill -9) after writing a sample but before its manifest recorded it: the store has
    1 more sample than the run's samples_written. The card's GPU-hours are over the store's count."""
    toml = write_dataset(tmp_path / "ds", target=12, rows=make_rows(12), max_new_tokens=64)
    root = tmp_path / "out"
    assert main(["generate", "--dataset", str(toml), "--server-url", shared_sim.url, "--output-dir", str(root),
                 "--progress", "quiet"]) == 0
    shard = sorted((root / "T").glob("shard-*.jsonl"))[-1]
    last = orjson.loads(shard.read_bytes().splitlines()[-1])
    with open(shard, "ab") as f:  # the line a killed run wrote after its last manifest commit
        f.write(orjson.dumps({**last, "id": "T-extra"}) + b"\n")
    out = tmp_path / "e" / "s.jsonl"
    assert export_here(root, "--dataset", "T", "--format", "specforge", "--out", out) == 0
    card = (out.parent / "README.md").read_text()
    assert re.search(r"^T: [\d.]+ GPU-h over .+ for 13 samples = ", card, re.M), card
