"""The trainers' loaders read what `export` writes: speculators 0.9.0's prepare-data and SpecForge 0.2.0's
data.prompts_path; SpecForge's offline path (safe_conversations_generator) keeps nothing of the tokens rows."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import orjson
import pytest

from gen_pipeline.export.core import ExportOptions, run_export
from gen_pipeline.export.select import ValSplit
from gen_pipeline.records import Sample
from gen_pipeline.store.dataset_store import DatasetStore


def _conversation(i: int) -> list[dict]:
    convs: list[dict] = [{"role": "user", "content": f"Question {i} about the cache"}]
    for k in range(1 + i % 3):
        convs.append({"role": "assistant", "content": f" answer {k} to {i}, the kernel and the batch",
                      "reasoning_content": f"First the layer {k} then the tensor {i}."})
        convs.append({"role": "user", "content": f"and then {k}?"})
    return convs[:-1]


@pytest.fixture(autouse=True)
def _no_stub_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision here is shim.py's stub: `datasets` must not take it for the real one (its torch formatter's
    `isinstance(x, VideoReader)` against a placeholder is a TypeError)."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "TORCHVISION_AVAILABLE", False)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(tokenizer folder, export folder, train file): 40 samples, 80 assistant turns, 10% validation."""
    root = tmp_path_factory.mktemp("trainers")
    # the committed offline qwen3-style tokenizer (python -m bench.chat_templates tests/data/tokenizers)
    qwen3 = Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "qwen3"
    tokenizer = Path(shutil.copytree(qwen3, root / "qwen3"))
    meta = {"model": "m", "backend": "sim", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1,
            "turns": 1, "sampling": {}, "kv_cache_dtype": "bf16", "generated_at": "x"}
    with DatasetStore(root / "outputs", "T", fingerprint={"model": "m"}, target=40) as store:
        store.open()
        store.write_samples([Sample(f"T-{i}", "T", _conversation(i), meta) for i in range(40)])
    folder = root / "exports"
    folder.mkdir()
    out = folder / "T.jsonl"
    run_export(ExportOptions(datasets=("T",), format="tokens", out=out, output_root=root / "outputs",
                             val=ValSplit(share=0.1), tokenizer=str(tokenizer)))
    return tokenizer, folder, out


def _rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_speculators_prepare_data_passes_the_tokens_rows_through(export: tuple[Path, Path, Path],
                                                                 tmp_path: Path) -> None:
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    tokenizer, _, out = export
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds, _ = load_and_preprocess_dataset(str(tokenizer), [str(out)], seq_length=100_000, build_dataset_num_proc=1,
                                            token_freq_path=tmp_path / "token_freq.pt")
    ours = sorted((r["input_ids"], r["loss_mask"]) for r in _rows(out))
    theirs = sorted((ids.tolist(), mask.tolist()) for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True))
    assert theirs == ours and len(ours) > 40  # every row, unchanged, no render endpoint needed


def test_speculators_given_the_export_folder_loads_no_validation_rows(export: tuple[Path, Path, Path]) -> None:
    from speculators.data_generation.preprocessing import load_raw_dataset

    _, folder, out = export
    assert (folder / "T.val.ndjson").is_file()
    raw, _ = load_raw_dataset(str(folder))
    assert sorted(raw["id"]) == sorted(r["id"] for r in _rows(out))


def test_specforge_prompts_path_reads_the_tokens_rows(export: tuple[Path, Path, Path]) -> None:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    _, _, out = export
    tasks = prepare_prompt_tasks(out, None, chat_template=None, max_length=100_000, is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None)
    assert [t["payload"] for t in tasks] == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
                                             for r in _rows(out)]


def test_specforge_offline_reads_conversations_only(export: tuple[Path, Path, Path]) -> None:
    """prepare_hidden_states.py --data-path goes through safe_conversations_generator: the tokens
    rows come out as empty conversations, so the offline path needs the conversation export."""
    from specforge.utils import safe_conversations_generator

    _, _, out = export
    assert {tuple(sorted(r)) for r in safe_conversations_generator(str(out))} == {("conversations",)}
    assert all(r["conversations"] == [] for r in safe_conversations_generator(str(out)))
