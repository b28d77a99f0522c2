"""`export --out exports/...` in a fresh clone: the folder is made on demand and git ignores it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from pipeline_helpers import REPO, run_cli, three_samples
from user_docs import user_docs


@pytest.fixture
def one_dataset(tmp_path: Path) -> Path:
    return three_samples(tmp_path / "outputs")


@pytest.mark.parametrize("fmt, out", [("specforge", "exports/sub/T.jsonl"), ("hf", "exports/chat")])
def test_export_makes_its_missing_folders(tmp_path: Path, one_dataset: Path, fmt: str, out: str) -> None:
    dest = tmp_path / out
    r = run_cli("export", "--dataset", "T", "--format", fmt, "--out", dest, "--output-dir", one_dataset,
                "--val-share", "1")
    assert (r.returncode, r.stderr) == (0, "")
    if fmt == "specforge":
        assert len(dest.read_bytes().splitlines()) == 2
        assert len(dest.with_name("T.val.ndjson").read_bytes().splitlines()) == 1
    else:
        assert (dest / "train").is_dir() and (dest / "validation").is_dir()


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_ignores_the_readmes_export_folders() -> None:
    readme = user_docs()
    outs = sorted(set(re.findall(r"(?:--out |OUT=)((?:exports|outputs)/[^\s`\"']+)", readme)))
    assert any(o.startswith("exports/") for o in outs)
    r = subprocess.run(["git", "check-ignore", "--no-index", *outs], capture_output=True, text=True, cwd=REPO)
    assert sorted(r.stdout.split()) == outs, orjson.dumps(outs).decode()
