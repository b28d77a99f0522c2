"""Builders the store tests share: a fingerprint, samples, a store under a test's folder, what kill -9 leaves,
and a file opener whose disk fills up."""

from __future__ import annotations

import errno
import functools
import os
import subprocess
import sys
from pathlib import Path

import orjson

from gen_pipeline.records import Sample
from gen_pipeline.store.dataset_store import DatasetStore

FP = {"model": "m", "source": {"files": ["a.jsonl"]}, "sampling": {"max_new_tokens": 64, "temperature": 0.7,
                                                                     "top_p": 0.95},
      "reasoning": "keep", "truncated": "keep"}


def sample(i: int, *, truncated: bool = False, model: str = "m", temperature: float = 0.7) -> Sample:
    return Sample(f"B2-{i}", "B2", [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
                  {"model": model, "finish_reason": "length" if truncated else "stop", "prompt_tokens": 10,
                   "completion_tokens": 20, "sampling": {"max_new_tokens": 64, "temperature": temperature,
                                                         "top_p": 0.95}})


def make(root: Path, dataset: str = "B2", **kw) -> DatasetStore:
    args = {"fingerprint": FP, "target": 100, "shard_max_samples": 4, "fsync_every": 3} | kw
    return DatasetStore(root, dataset, **args)


def write(root: Path, ids: range, **kw) -> None:
    with make(root, **kw) as s:
        s.open()
        s.write_samples([sample(i) for i in ids])


def shard_ids(folder: Path) -> list[str]:
    """Every id on disk, in shard then line order."""
    return [orjson.loads(line)["id"] for p in sorted(folder.glob("shard-*.jsonl"))
            for line in p.read_bytes().splitlines()]


def crash(store: DatasetStore) -> None:
    """What kill -9 leaves: open files dropped, the lock file naming a pid that is gone."""
    store._close_files()
    os.close(store._lock._fd)
    store._lock._fd = -1
    (store.folder / ".lock").write_bytes(orjson.dumps({"pid": dead_pid(), "host": os.uname().nodename,
                                                       "started_at": "2026-01-01T11:02:03+00:00"}))


@functools.cache
def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


class FullDisk:
    """file_opener that lets `budget` bytes reach the shards, then writes half a blob and fails."""

    def __init__(self, budget: int, err: int = errno.ENOSPC):
        self.budget, self.err = budget, err

    def __call__(self, path: Path, mode: str):
        opener = self

        class Handle:
            def __init__(self):
                self.f = open(path, mode)  # noqa: SIM115 - the wrapper owns it: close() below closes it

            def write(self, data: bytes) -> int:
                if path.name.startswith("shard-"):
                    if len(data) > opener.budget:
                        self.f.write(data[: len(data) // 2])
                        self.f.flush()
                        raise OSError(opener.err, os.strerror(opener.err))
                    opener.budget -= len(data)
                return self.f.write(data)

            def __getattr__(self, name: str):  # flush, fileno, close: the real file's
                return getattr(self.f, name)

        return Handle()
