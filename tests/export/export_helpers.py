"""Builders the export tests share."""

from __future__ import annotations

from pathlib import Path

import orjson

from gen_pipeline.cli import main
from gen_pipeline.records import Failure, Sample
from gen_pipeline.store.dataset_store import DatasetStore

from pipeline_helpers import run_cli


def export(root: Path, *args: str | Path) -> str:
    """`gen-pipeline export --output-dir root ARGS`, which must succeed with nothing on stderr: its stdout."""
    r = run_cli("export", "--output-dir", root, *args)
    assert (r.returncode, r.stderr) == (0, ""), r.stdout
    return r.stdout


def export_here(root: Path, *args: str | Path) -> int:
    """`gen-pipeline export --output-dir root ARGS` in this process (main()): its exit code."""
    return main(["export", "--output-dir", str(root), *map(str, args)])


def fail(root: Path, *args: str | Path) -> tuple[int, str]:
    """`gen-pipeline export --output-dir root ARGS`, which must fail with nothing on stdout, no traceback."""
    r = run_cli("export", "--output-dir", root, *args)
    assert r.stdout == "" and "Traceback" not in r.stderr
    return r.returncode, r.stderr


def specforge_payloads(path: Path, max_length: int = 1_000_000) -> list[dict]:
    """The rows SpecForge 0.2.0's own loader (data.prompts_path: prompt_builder.py:57-83, 219-252) keeps of a
    tokens file at data.max_length `max_length`, as it hands them to training: {"input_ids", "loss_mask"}."""
    from specforge.data.prompt_builder import prepare_prompt_tasks  # installed --no-deps (Makefile)

    return [t["payload"] for t in prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length,
                                                       is_preformatted=False, train_only_last_turn=False,
                                                       cache_dir=None, cache_key=None, num_proc=None)]


def jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def write_store(root: Path, name: str, samples: list[Sample], failures: list[Failure] | None = None) -> Path:
    """A dataset `name` under `root` holding exactly `samples` (and `failures` in errors.jsonl): root."""
    with DatasetStore(root, name, fingerprint={"model": "m"}, target=len(samples)) as store:
        store.open()
        store.write_samples(samples)
        store.write_failures(failures or [])
    return root
