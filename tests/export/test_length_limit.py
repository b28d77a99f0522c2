"""`export --format tokens` and `check-template` say how many rows and trained tokens SpecForge's pre-tokenized
loader keeps at a data.max_length (--max-length, default 2,048): checked against that loader itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from export_helpers import write_store
from template_tokenizers import build_tokenizer

from gen_pipeline.cli import main
from gen_pipeline.records import Sample

# (prompt tokens, output tokens) per sample: fits both; cut at 2,048; nothing trained before 2,048; long
LENGTHS = [(100, 200), (1500, 1000), (2100, 50), (3000, 4000), (7000, 2000), (300, 20)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("out")
    samples = []
    for i, (p, o) in enumerate(LENGTHS):
        turn = {"role": "assistant", "content": "a", "reasoning_content": "r",
                "prompt_token_ids": [5 + i % 7] * p, "token_ids": [9] * o}
        samples.append(Sample(f"S-{i}", "S", [{"role": "user", "content": "q"}, turn],
                              {"model": "m", "finish_reason": "stop", "prompt_tokens": p, "completion_tokens": o,
                               "turns": 1, "chat_template_kwargs": "{}"}))
    return write_store(root, "S", samples)


def _specforge(path: Path, max_length: int) -> tuple[int, int]:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    tasks = prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length, is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None)
    return len(tasks), sum(sum(t["payload"]["loss_mask"]) for t in tasks)


@pytest.mark.parametrize("max_length", [2048, 8192])
def test_export_reports_what_specforges_loader_keeps(store: Path, tmp_path: Path, max_length: int,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    flags = [] if max_length == 2048 else ["--max-length", str(max_length)]
    assert main(["export", "--output-dir", str(store), "--dataset", "S", "--format", "tokens", "--out", str(out),
                 *flags]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "SpecForge data.max_length" in x)
    m = re.fullmatch(r"  (note|warning): SpecForge data\.max_length ([\d,]+): ([\d,]+) of 6 rows kept, ([\d,]+) of "
                     r"([\d,]+) trained tokens \(([\d.]+)%\)(.*)", line)
    assert m, line
    kind, limit, rows, kept, total, _, rest = m.groups()
    total_trained = sum(o for _, o in LENGTHS)
    assert (int(limit.replace(",", "")), int(total.replace(",", ""))) == (max_length, total_trained)
    assert (int(rows), int(kept.replace(",", ""))) == _specforge(out, max_length)
    # 2,048: the second row cut to 548 trained tokens, three rows with none left; 8,192: the fifth row cut
    assert (kind, int(rows), kept, bool(rest)) == {2048: ("warning", 3, "768", True),
                                                   8192: ("warning", 6, "6,462", True)}[max_length]


def test_check_template_reports_it_too(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chatml = build_tokenizer(tmp_path / "chatml", "chatml")
    assert main(["check-template", "--output-dir", str(store), "--dataset", "S", "--tokenizer", str(chatml),
                 "--max-length", "8192"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("  warning: --format tokens, SpecForge data.max_length 8,192: 6 of 6 rows kept, 6,462 of 7,270 trained "
            "tokens (88.9%); rows are cut at max_length and those left with no trained token are dropped: raise "
            "data.max_length to the longest row (see --max-length N) or leave the long rows out") in lines
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        main(["export", "--output-dir", str(store), "--dataset", "S", "--format", "tokens",
              "--out", str(tmp_path / "t.jsonl"), "--max-length", "0"])
    assert e.value.code == 2
    assert "argument --max-length: '0' must be a whole number of tokens, 1 or more (e.g. 8192)" in \
        capsys.readouterr().err
