"""`generate --input prompts.jsonl` without a dataset TOML: the schema inferred, the TOML written beside the
output, the same command resuming."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gen_pipeline.cli import main
from gen_pipeline.config.from_input import infer_input

from pipeline_helpers import make_rows


def _prompts(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.mark.parametrize(("rows", "inferred"), [
    (make_rows(6), ("messages", "messages", "id", 6)),
    ([{"conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(4)],
     ("sharegpt", "conversations", "", 4)),
    ([{"id": i % 2, "prompt": f"q{i}"} for i in range(4)], ("prompt", "prompt", "", 4)),  # ids not unique
    ([{"question": "same"}, {"question": "same"}, {"question": ""}], ("prompt", "question", "", 1)),
])
def test_the_schema_is_inferred_from_the_rows(tmp_path: Path, rows: list[dict], inferred: tuple) -> None:
    got = infer_input(_prompts(tmp_path / "p.jsonl", rows))
    assert (got.schema, got.field, got.id_field, got.valid) == inferred


def test_a_file_with_no_usable_column_is_refused_naming_its_columns(tmp_path: Path, capsys) -> None:
    path = _prompts(tmp_path / "p.jsonl", [{"q": "x", "a": "y"}])
    assert main(["generate", "--input", str(path), "--output-dir", str(tmp_path / "out"), "--server", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --input {path}: no column holds a conversation (messages, conversations, ")
    assert err.endswith("its rows have a, q. Rename the column, or write a dataset TOML naming it (source.field).\n")
    assert not (tmp_path / "out").exists()


def test_one_command_run_writes_its_toml_and_the_same_command_resumes(tmp_path: Path, capsys) -> None:
    path = _prompts(tmp_path / "data" / "prompts.jsonl", make_rows(5))
    out = tmp_path / "out"
    argv = ["generate", "--input", str(path), "--output-dir", str(out), "--server", "sim", "--progress", "quiet",
            "--max-new-tokens", "32", "--temperature", "0.5"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    toml = out / "prompts.toml"
    assert first.startswith(f"prompts: wrote {toml} (schema 'messages', field 'messages', target 5): the same "
                            f"command, or --dataset {toml}, resumes\n"), first
    assert "prompts: 5/5 samples (100.0%), +5 this run in " in first
    text = toml.read_text()
    assert text.startswith(f"# Written by: gen-pipeline {' '.join(argv)}\n")
    assert text.endswith(f'name = "prompts"\ntarget_samples = 5\n\n[source]\nfiles = ["{path}"]\nschema = "messages"\n'
                         'field = "messages"\nid_field = "id"\n\n[sampling]\nmax_new_tokens = 32\n'
                         "temperature = 0.5\ntop_p = 0.95\n")
    lines = (out / "prompts" / "shard-00000.jsonl").read_bytes().splitlines()
    assert sorted(orjson.loads(line)["id"] for line in lines) == [f"prompts-r{i}" for i in range(5)]
    assert all(orjson.loads(line)["meta"]["sampling"]["temperature"] == 0.5 for line in lines)

    assert main(argv) == 0  # the same command: resumes, nothing to do
    again = capsys.readouterr().out
    assert again.startswith(f"prompts: resuming {toml} (the dataset TOML of --input prompts.jsonl)\n"), again
    assert "the target is already reached, nothing to do." in again
    assert main(["generate", "--dataset", str(toml), "--output-dir", str(out), "--server", "sim",
                 "--progress", "quiet"]) == 0
    assert "the target is already reached, nothing to do." in capsys.readouterr().out

    assert main([*argv[:-1], "0.9"]) == 2  # another temperature: refused, the TOML kept
    assert capsys.readouterr().err == (
        f"error: {toml} was written by an earlier run with other settings (sampling.temperature 0.5 there, 0.9 now); "
        f"its samples were made with it. Resume it as it is with --dataset {toml} (or the same flags as then), or "
        "pass another --output-dir to start anew.\n")
    assert toml.read_text() == text  # a sampling flag without --input: test_cli's flag mistakes
