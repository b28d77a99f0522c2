"""Export's reasoning check reads every kind of conversation (multi-turn ones first), not 32 drawn by chance;
check-template warns in the words export uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from export_helpers import write_store

from gen_pipeline.cli import main
from gen_pipeline.export.select import covering
from gen_pipeline.export.template_check import REASONING_ADVICE
from gen_pipeline.records import Sample

SINGLE, MULTI = 209, 3  # 3 multi-turn samples in 212, as in the issue


def _turn(i: int, k: int) -> dict:
    return {"role": "assistant", "content": f"the answer {i} to part {k} is here",
            "reasoning_content": f"first think about part {k} of question {i} then answer"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("out")
    samples = []
    for i in range(SINGLE + MULTI):
        convs = [{"role": "user", "content": f"question {i}"}, _turn(i, 0)]
        if i >= SINGLE:
            convs += [{"role": "user", "content": f"and then {i}?"}, _turn(i, 1)]
        samples.append(Sample(f"S-{i:03d}", "S", convs, {"model": "m", "finish_reason": "stop", "prompt_tokens": 5,
                                                         "completion_tokens": 9, "turns": len(convs) // 2,
                                                         "chat_template_kwargs": "{}"}))
    return write_store(root, "S", samples)


def test_the_check_covers_every_multi_turn_sample(store: Path) -> None:
    rows = [{"id": f"S-{i}", "conversations": [{"role": "assistant"}] * (2 if i >= SINGLE else 1), "meta": {}}
            for i in range(SINGLE + MULTI)]
    for seed in range(10):
        chosen = covering(rows, 32, seed)
        assert len(chosen) == 32 and sum(len(r["conversations"]) > 1 for r in chosen) == MULTI


@pytest.mark.parametrize("seed", range(10))
def test_require_trained_reasoning_refuses_whatever_the_seed(store: Path, tmp_path: Path, seed: int,
                                                             built: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-style: SpecForge trains the last turn's reasoning only; the 3 multi-turn samples' first turns
    are untrained, so the export must refuse for every seed (it passed for 3 seeds of 10)."""
    out = tmp_path / "s.jsonl"
    rc = main(["export", "--output-dir", str(store), "--dataset", "S", "--format", "specforge", "--out", str(out),
               "--tokenizer", str(built["qwen3"]), "--require-trained-reasoning", "--seed", str(seed)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.startswith("error: --require-trained-reasoning: only ") and "% of the reasoning tokens of 32 " in err


def test_check_template_warns_in_exports_words(store: Path, tmp_path: Path, built: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    kimi = built["kimi"]
    assert main(["export", "--output-dir", str(store), "--dataset", "S", "--format", "specforge",
                 "--out", str(tmp_path / "s.jsonl"), "--tokenizer", str(kimi)]) == 0
    warning = capsys.readouterr().out.splitlines()[-1]
    assert warning == ("  warning: 0.0% of the reasoning tokens of 32 samples are under the loss mask when SpecForge "
                       f"(thinking parser), every assistant span of a row renders them with the chat template of "
                       f"{kimi}. {REASONING_ADVICE}")
    assert main(["check-template", "--output-dir", str(store), "--dataset", "S", "--tokenizer", str(kimi),
                 "--samples", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert warning in lines
    assert [line.split(" when ")[1].split(" renders ")[0] for line in lines if line.startswith("  warning: ")] == [
        "SpecForge (thinking parser), every assistant span of a row", "SpecForge with data.train_only_last_turn: true",
        "SpecForge on --expand-turns rows", "speculators prepare-data (one row per assistant turn)"]
