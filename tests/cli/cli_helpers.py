"""Helpers for the CLI tests: an output folder written directly through the store."""

from __future__ import annotations

from pathlib import Path

from gen_pipeline.records import Sample
from gen_pipeline.store.dataset_store import DatasetStore

TOKENS = {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1}


def stored(root: Path, name: str, n: int, *, target: int, meta: dict | None = None, stats: dict | None = None,
           **store: int) -> None:
    """Dataset `name` under `root`: `n` committed one-turn samples (q, a) with `meta`; `stats` closes the run."""
    with DatasetStore(root, name, fingerprint={"model": "m"}, target=target, **store) as s:
        s.open()
        turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        s.write_samples([Sample(f"{name}-{i}", name, turns, dict(TOKENS if meta is None else meta)) for i in range(n)])
        if stats is not None:
            s.close(stats)
