"""Writing: results from the request streams to the store in batches, with periodic commits."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from gen_pipeline.records import Failure, Reject, Sample
from gen_pipeline.run.dispatch import Item
from gen_pipeline.store.dataset_store import DatasetStore
from gen_pipeline.store.manifest import ProgressRecord

BATCH = 256  # items written per thread hop


class BatchWriter:
    """Drains the stream into the store until every sender is closed; commits every commit_interval_s
    with the live figures. `check` runs after each batch (it raises a fatal error of the run)."""

    def __init__(self, store: DatasetStore, commit_interval_s: float, progress: Callable[[], ProgressRecord],
                 check: Callable[[], None]) -> None:
        self.store, self.commit_interval_s = store, commit_interval_s
        self._progress, self._check = progress, check

    async def run(self, recv: MemoryObjectReceiveStream[Item]) -> None:
        last_commit = time.monotonic()
        async with recv:
            while True:
                batch: list[Item] = []
                with anyio.move_on_after(self.commit_interval_s):
                    try:
                        batch.append(await recv.receive())
                    except anyio.EndOfStream:
                        return
                while len(batch) < BATCH:
                    try:
                        batch.append(recv.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await anyio.to_thread.run_sync(self.write_batch, batch)
                if time.monotonic() - last_commit >= self.commit_interval_s:
                    last_commit = time.monotonic()
                    await anyio.to_thread.run_sync(self.store.commit, self._progress())
                self._check()

    def write_batch(self, batch: list[Item]) -> None:
        samples = [x for x in batch if isinstance(x, Sample)]
        failures = [x for x in batch if isinstance(x, Failure)]
        rejects = [x for x in batch if isinstance(x, Reject)]
        if samples:
            self.store.write_samples(samples)
        if failures:
            self.store.write_failures(failures)
        if rejects:
            self.store.write_rejects(rejects)
