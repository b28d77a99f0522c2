"""What a new user trips on, in-process through `cli.main`: the whole message the user sees."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import stored

import gen_pipeline.sources.loading as loading
from gen_pipeline.cli import main

from pipeline_helpers import REPO, write_dataset

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


# ---------------------------------------------------------------- item 13: a bad file in the config folder


def _warnings(cfg: Path) -> str:
    return (f"warning: {cfg}/bad.toml: not UTF-8 text (byte 0xe9 at offset 11); a TOML file must be UTF-8. Save it "
            "as UTF-8, or move it out of the config folder if it is no config. (skipped)\n"
            f"warning: {cfg}/old.toml is a folder, not a TOML file. Rename it (only config files may end in .toml) "
            "or move it out of the config folder. (skipped)\n")


def test_each_bad_file_is_a_warning_of_plan_status_and_generate_all_and_check_of_one_names_it(tmp_path: Path,
                                                                                              capsys) -> None:
    cfg = tmp_path / "cfg"  # T.toml beside a Latin-1 bad.toml and a folder old.toml
    write_dataset(cfg, target=3)
    shutil.copy(REPO / "datasets_cfg" / "server.toml", cfg / "server.toml")
    (cfg / "bad.toml").write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    (cfg / "old.toml").mkdir()
    code = main(["plan", "--config-dir", str(cfg), "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert (code, err) == (0, _warnings(cfg))
    assert f"the job (T of {cfg}/: 3 samples to do)" in out, out
    (tmp_path / "out").mkdir()
    code = main(["status", "--config-dir", str(cfg), "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert (code, err) == (0, _warnings(cfg).replace(" (skipped)", ""))
    assert "T " in out and "not started" in out, out
    code = main(["check", "--dataset", "bad", "--config-dir", str(cfg), "--server", "sim"])
    assert (code, capsys.readouterr().err) == (2, "error: " + _warnings(cfg).splitlines()[0].removeprefix(
        "warning: ").removesuffix(" (skipped)") + "\n")
    out = tmp_path / "out"  # generate --dataset all runs the rest
    code = main(["generate", "--dataset", "all", "--config-dir", str(cfg), "--server", "sim", "--output-dir", str(out),
                 "--progress", "quiet"])
    text = capsys.readouterr()
    assert code == 0, text
    assert text.err.startswith(_warnings(cfg)), text.err
    assert len((out / "T" / "shard-00000.jsonl").read_bytes().splitlines()) == 3


# ---------------------------------------------------------------- item 14: export --format tokens --server NAME


def test_tokens_export_says_why_the_servers_tokenizer_is_not_there(tmp_path: Path, capsys) -> None:
    """--server sim was passed: the message names its model's tokenizer, never "pass --tokenizer or --server"."""
    stored(tmp_path, "B2", 1, target=3)
    code = main(["export", "--dataset", "B2", "--output-dir", str(tmp_path), "--format", "tokens",
                 "--out", str(tmp_path / "x.jsonl"), "--server", "sim", "--config-dir", str(REPO / "datasets_cfg")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: sample B2-0 has no server token ids (prompt_token_ids / token_ids on its assistant "
                          "turns), so the tokens format renders it with the target's chat template: --server sim: "
                          "its model moonshotai/Kimi-K2.5"), err
    assert "pass --tokenizer PATH or --server NAME" not in err


# ---------------------------------------------------------------- item 15: status --output-dir (missing: test_cli)


@pytest.mark.parametrize("command", [["status"], ["validate", "--dataset", "T"], ["plan"]])
def test_an_empty_output_dir_is_refused(capsys, command: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*command, "--output-dir", ""])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"gen-pipeline {command[0]}: error: argument --output-dir: is empty, which would mean the current folder: "
        "name the folder (e.g. outputs), or leave the flag out for its default\n")


# ---------------------------------------------------------------- item 16: small ones


def test_plan_into_a_closed_pipe_exits_0_quietly() -> None:
    """`plan | head -1`: the reader gone before plan writes (its end closed at once), so every write fails."""
    import subprocess

    from pipeline_helpers import cli_cmd

    proc = subprocess.Popen(cli_cmd("plan"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (0, b"")


def test_a_rerun_with_nothing_to_do_is_not_a_run_in_gpu_hours_and_the_report_counts_runs(tmp_path: Path,
                                                                                        capsys) -> None:
    pytest.importorskip("matplotlib")
    toml = write_dataset(tmp_path / "cfg", target=3)
    out = tmp_path / "out"
    argv = ["generate", "--dataset", str(toml), "--server", "sim", "--output-dir", str(out), "--progress", "quiet"]
    for _ in range(3):  # the run, then two reruns with nothing to do
        assert main(argv) == 0
    capsys.readouterr()
    assert main(["status", "--dataset", str(toml), "--output-dir", str(out)]) == 0
    gpu = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  T: ")]
    assert len(gpu) == 1 and re.fullmatch(r"  T: \d+\.\d\d GPU-h over \S+ for 3 samples = \d+\.\d\d GPU-h per "
                                          r"1,000 samples \(tp 8 × dp 1 × 1 server\)", gpu[0]), gpu
    page = tmp_path / "r.html"
    assert main(["report", "--dataset", "T", "--output-dir", str(out), "--out", str(page)]) == 0
    text = page.read_text()
    assert "<p>3 runs, 0 server restarts, " in text, text[:3000]
    assert "nothing to do (the target was already reached)" in text and "nothing_to_do" not in text


def test_validate_says_a_torn_last_line_is_cut_by_the_next_run(tmp_path: Path, capsys) -> None:
    stored(tmp_path, "B2", 2, target=3)
    with open(tmp_path / "B2" / "shard-00000.jsonl", "ab") as f:
        f.write(b'{"id":"B2-2","data')  # what a SIGKILL mid-write leaves
    assert main(["validate", "--dataset", "B2", "--output-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ("    shard-00000.jsonl:3: not valid JSON; it is the last line, a write cut short (a crash, or a run "
            "writing now): the next generate run cuts it off, and export skips it") in out.splitlines(), out
