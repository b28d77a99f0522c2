"""Issue 31 items 9, 13, 14, 15, 16: what a new user trips on, in-process through `cli.main`. Each test
asserts the whole message the user sees."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import gen_pipeline.sources.loading as loading
from gen_pipeline.cli import main

from pipeline_helpers import write_dataset

# ---------------------------------------------------------------- item 9: a full datasets cache, EFBIG


def _failing_datasets(monkeypatch, cache: Path, exc: BaseException) -> None:
    """`datasets` whose load_dataset raises `exc` (as a cause of its own error, as datasets wraps them)."""
    def load_dataset(*_a, **_k):
        try:
            raise exc
        except BaseException as e:
            raise RuntimeError("An error occurred while generating the dataset") from e

    fake = SimpleNamespace(load_dataset=load_dataset, config=SimpleNamespace(HF_DATASETS_CACHE=str(cache)))
    monkeypatch.setattr(loading, "_datasets", lambda: fake)


ROLE = "the datasets cache {cache}, where the source is converted to Arrow before a run reads it"


@pytest.mark.parametrize(("exc", "says"), [
    (OSError("Not enough disk space. Needed: 0 bytes (download: 0 bytes, generated: 0 bytes, post-processed: "
             "Unknown size)"),
     "the disk of {cache} is full (datasets: Not enough disk space; " + ROLE + "). Free space there, or set "
     "HF_DATASETS_CACHE to a folder on a disk with room, then run again."),
    (OSError(errno.EFBIG, os.strerror(errno.EFBIG), "{cache}/json/train.arrow"),
     "a file in {cache}/json grew past the largest size allowed (File too large: the filesystem's limit or the "
     "shell's ulimit -f; " + ROLE + "). Raise the limit, or set HF_DATASETS_CACHE to a folder on a disk without "
     "that limit, then run again."),
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "{cache}/json/train.arrow"),
     "the disk of {cache}/json is full (No space left on device; " + ROLE + "). Free space there, or set "
     "HF_DATASETS_CACHE to a folder on a disk with room, then run again."),
])
def test_a_full_or_too_large_datasets_cache_says_which_folder(tmp_path: Path, monkeypatch, capsys,
                                                               exc: OSError, says: str) -> None:
    toml = write_dataset(tmp_path / "ds", target=5)
    cache = tmp_path / "cache"
    (cache / "json").mkdir(parents=True)
    if exc.filename:
        exc.filename = exc.filename.format(cache=cache)
    _failing_datasets(monkeypatch, cache, exc)
    code = main(["check", "--dataset", str(toml), "--server", "sim", "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert (code, err) == (4, f"error: {toml}: could not load source T.jsonl: {says.format(cache=cache)}\n")
