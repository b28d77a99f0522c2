"""Bad input, each where the user meets it: the whole message and the exit code."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import orjson
import pytest
from cli_helpers import stored
from mounts import in_tmpfs, require_namespaces

from gen_pipeline.config.server import load_server_profile
from gen_pipeline.errors import ConfigError
from gen_pipeline.reports.status import status_all
from tests.reports.test_check import config_dir_with

from pipeline_helpers import REPO, cli_cmd, make_rows, run_cli, three_samples, write_dataset

LOADING = "T: loading the source T.jsonl\n"  # what generate says before the source check refuses

LATIN1_ROWS = b"".join(orjson.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": "caf\u00e9 ?"}]})
                       .decode().encode("latin-1") + b"\n" for i in range(3))

# (what the file is, how to make it, the message after "source.files: ")
SOURCES = [
    ("empty", lambda p: p.write_bytes(b""),
     "T.jsonl is empty (0 bytes): there are no rows to generate from. Point source.files at the dataset's file."),
    ("blank-lines", lambda p: p.write_bytes(b"\n  \n\n"),
     "T.jsonl holds no rows (only blank lines). Point source.files at the dataset's file."),
    ("binary", lambda p: p.write_bytes(bytes(range(256)) * 4),
     "T.jsonl is not text: it holds binary data (a NUL byte at byte 1). A .jsonl source is UTF-8 JSON; is it the "
     "right file?"),
    ("gzip", lambda p: p.write_bytes(gzip.compress(b'{"id": "r0"}\n')),
     "T.jsonl is not text but gzip-compressed: decompress it (gunzip) and list the .jsonl it holds."),
    ("latin-1", lambda p: p.write_bytes(LATIN1_ROWS),
     "T.jsonl is not UTF-8 text (byte 0xe9 at line 1, column 53): JSON must be UTF-8. Convert it, e.g. iconv -f "
     "latin1 -t utf-8 T.jsonl > utf8-T.jsonl, and list the copy in source.files."),
    ("no-json-line", lambda p: p.write_bytes(b"question one\nquestion two\n"),
     "T.jsonl has no line that is a JSON object: all its 2 non-blank lines are bad (line 1 is not valid JSON "
     "(unexpected character, expected a JSON value, column 1)). A JSON Lines file holds one JSON object per line; "
     "is it the right file?"),
    ("directory", lambda p: (p.mkdir(), (p / "part-0.jsonl").write_bytes(b"{}\n"), (p / "part-1.jsonl").touch()),
     "T.jsonl is a directory, not a file: list the files in it instead, e.g. files = ['T.jsonl/part-0.jsonl', "
     "'T.jsonl/part-1.jsonl']."),
]


@pytest.mark.parametrize(("make", "message"), [pytest.param(m, t, id=i) for i, m, t in SOURCES])
def test_a_file_that_cannot_be_a_source_is_named_with_what_to_do(tmp_path: Path, make, message: str) -> None:
    toml = write_dataset(tmp_path / "ds", target=5)
    (tmp_path / "ds" / "T.jsonl").unlink()
    make(tmp_path / "ds" / "T.jsonl")
    r = run_cli("check", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {toml}: source.files: {message}\n")


def test_generate_refuses_such_a_source_before_any_server_starts(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=5)
    (tmp_path / "ds" / "T.jsonl").write_bytes(b"")
    r = run_cli("generate", "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stdout) == (2, LOADING)
    assert r.stderr == (f"error: {toml}: source.files: T.jsonl is empty (0 bytes): there are no rows to generate "
                        "from. Point source.files at the dataset's file.\n")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a full datasets cache


@pytest.mark.e2e  # the process is the subject: make e2e
@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_full_datasets_cache_is_a_disk_error(tmp_path: Path, command: str) -> None:
    """The cache on a real 256 KiB tmpfs; the source (~1 MB as Arrow) does not fit: exit 4, a disk message."""
    require_namespaces()
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}: " + "words " * 40}]}
            for i in range(3000)]
    toml = write_dataset(tmp_path / "ds", target=5, rows=rows)
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = cli_cmd(command, "--dataset", toml, "--server", "sim", "--output-dir", tmp_path / "out")
    r = subprocess.run(in_tmpfs(cache, argv), capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "HF_DATASETS_CACHE": str(cache)})
    assert (r.returncode, r.stdout) == (4, LOADING if command == "generate" else ""), r.stderr
    head, sep, tail = r.stderr.partition(" is full (No space left on device; the datasets cache ")
    assert sep and head.startswith(f"error: {toml}: could not load source T.jsonl: the disk of {cache}"), r.stderr
    assert tail == (f"{cache}, where the source is converted to Arrow before a run reads it). Free space there, or "
                    "set HF_DATASETS_CACHE to a folder on a disk with room, then run again.\n")


# ---------------------------------------------------------------- prompts that cannot fit the context


def test_check_and_generate_refuse_when_most_prompts_cannot_fit_the_context(tmp_path: Path) -> None:
    toml = write_dataset(tmp_path / "ds", target=15, rows=make_rows(20), max_new_tokens=100)
    cfg = config_dir_with(tmp_path, '[profile.ctx]\ninherits = "sim"\ncontext_length = 100\n')
    problem = (f"{toml}: 20 of 20 measured prompts do not fit the context: prompt + max_new_tokens (100) may be at "
               f"most the context length, 100 tokens ({cfg}/server.toml [profile.ctx] context_length); the median "
               "prompt is ~13 tokens. SGLang refuses such requests (HTTP 400), so a run would fail them. To fix: "
               "lower sampling.max_new_tokens (at most 87 lets the median prompt fit), raise context_length, or "
               "reject long rows with source.max_prompt_chars.")
    r = run_cli("check", "--dataset", toml, "--server", "ctx", "--config-dir", cfg, "--output-dir", tmp_path / "out")
    assert (r.returncode, r.stderr) == (2, f"error: {problem}\n")
    assert r.stdout.endswith(f"  1 problem(s); generate refuses to launch (--proceed-anyway overrides):\n"
                             f"    - {problem}\n")
    r = run_cli("generate", "--dataset", toml, "--server", "ctx", "--config-dir", cfg, "--output-dir",
                tmp_path / "out")
    assert (r.returncode, r.stdout, r.stderr) == (2, LOADING, f"error: {problem}\n")


# ---------------------------------------------------------------- export and report into a read-only folder


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "--dataset", "T", "--format", "specforge", "--out", "{dest}/T.jsonl"],
     "Cannot write --out {dest}/T.jsonl: Read-only file system (in {dest}). Choose an --out in a folder you can "
     "write, or make that folder writable."),
    (["export", "--dataset", "T", "--format", "hf", "--out", "{dest}/hf"],
     "Cannot write --out {dest}/hf: Read-only file system (in {dest}). Choose an --out in a folder you can write, "
     "or make that folder writable."),
    (["report", "--dataset", "T", "--out", "{dest}/T.html"],
     "Cannot write the report {dest}/T.html: Read-only file system. Nothing was written; pass --out with a path in "
     "a folder you can write (e.g. --out /tmp/T.html)."),
], ids=["export-specforge", "export-hf", "report"])
@pytest.mark.e2e  # the process is the subject: make e2e
def test_export_and_report_into_a_read_only_folder(tmp_path: Path, argv: list[str], message: str) -> None:
    require_namespaces()
    one_dataset = three_samples(tmp_path / "out")
    dest = tmp_path / "dest"
    dest.mkdir()
    argv = [a.format(dest=dest) for a in argv]
    r = subprocess.run(in_tmpfs(dest, cli_cmd(*argv, "--output-dir", one_dataset), read_only=True),
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (4, "", f"error: {message.format(dest=dest)}\n")


# ---------------------------------------------------------------- server.toml: a key is named where it is written


@pytest.mark.parametrize(("parent", "port", "message"), [
    ("mem_fration_static = 0.9", 30000, "profile.base.mem_fration_static: unknown key. Known keys here: "),
    ('tp_size = "8"', 30000, "profile.base.tp_size = '8' must be an integer (got a string). Remove the quotes."),
    ("tp_size = 0", 30000, "profile.base.tp_size = 0 must be at least 1."),
    ("mem_fraction_static = 1.5", 30000, "profile.base.mem_fraction_static = 1.5 must be a number between 0 and 1"),
    ("[profile.base.env]\nNCCL_DEBUG = 1", 30000, "profile.base.env.NCCL_DEBUG = 1 must be a string"),
    ("", 70000, "profile.run.port = 70000 must be 0 (pick a free one) or a TCP port up to 65535.\0"),
], ids=["typo", "type", "range", "fraction", "env", "own-key"])
def test_a_bad_key_of_an_inherited_profile_is_named_where_it_is_written(tmp_path: Path, parent: str, port: int,
                                                                        message: str) -> None:
    """A key of the profile itself is still named under it; "\\0" ends a whole message."""
    toml = tmp_path / "server.toml"
    toml.write_text(f'[profile.base]\nmodel_path = "m"\n{parent}\n\n[profile.mid]\ninherits = "base"\n\n'
                    f'[profile.run]\ninherits = "mid"\nport = {port}\n')
    with pytest.raises(ConfigError) as e:
        load_server_profile("run", toml)
    assert (str(e.value) + "\0").startswith(f"{toml}: {message}"), str(e.value)


# ---------------------------------------------------------------- status of one dataset


def test_status_of_one_dataset_shows_that_dataset_alone(tmp_path: Path) -> None:
    for name in ("T", "U"):
        stored(tmp_path, name, 1, target=2, meta={})
    assert [d.dataset for d in status_all(tmp_path, {"U": 2}, others=False).datasets] == ["U"]
    assert [d.dataset for d in status_all(tmp_path, {"U": 2}).datasets] == ["U", "T"]  # `make status`: every folder
    r = run_cli("status", "--dataset", "U", "--output-dir", tmp_path, "--json")
    assert (r.returncode, list(orjson.loads(r.stdout)["datasets"])) == (0, ["U"])
