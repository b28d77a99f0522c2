from pathlib import Path

import pytest
from datasets import disable_progress_bars
from template_tokenizers import build_all

from pipeline_helpers import chat_tokenizers, run_cli, write_dataset

disable_progress_bars()  # every export test loads with datasets


@pytest.fixture(scope="session")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """outputs/ with the demo (240 samples, 286 assistant turns, 5 truncated, reasoning kept) and T (60)."""
    root = tmp_path_factory.mktemp("outputs")
    r = run_cli("generate", "--dataset", "demo", "--server", "sim", "--output-dir", root)
    assert r.returncode == 0, r.stderr + r.stdout
    toml = write_dataset(tmp_path_factory.mktemp("cfg"), name="T", target=60)
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", root)
    assert r.returncode == 0, r.stderr + r.stdout
    return root


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The committed offline chat tokenizers, copied (a test may change its copy): {kind: folder}."""
    return chat_tokenizers(tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Chat tokenizers built here (tests/template_tokenizers.py): {kind: folder}."""
    return build_all(tmp_path_factory.mktemp("built"))
