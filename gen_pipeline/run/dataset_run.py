"""One dataset's part of a job: its store, feed, dispatcher, writer, stats and telemetry; its log records carry
`extra={"dataset": name}`, so the CLI files them in the dataset's run.log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.records import Failure, LoadSnapshot, Prompt, Reject, RunSnapshot, Sample
from gen_pipeline.run.dispatch import Dispatcher, Item, Window
from gen_pipeline.run.options import RunOptions, RunSummary
from gen_pipeline.run.readers import Readers
from gen_pipeline.run.stats import RunStats
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.sources.loading import LoadedSource, SourceStats, estimate_prompt_tokens, iter_prompts
from gen_pipeline.store.dataset_store import DatasetStore
from gen_pipeline.store.manifest import ProgressRecord, progress_record
from gen_pipeline.store.ranks import RankSpec
from gen_pipeline.store.telemetry import Telemetry

EVENTS = logging.getLogger("gen_pipeline.run")  # what a user watching the run should see
JOURNAL = logging.getLogger("gen_pipeline.journal")  # the run's record: start, controller decisions, end
BATCH = 256  # items per thread hop (prompts read, results written); a dataset's result stream holds ×4


class Feed:
    """The source's prompts in batches (read in a thread), and the rows it rejected meanwhile."""

    def __init__(self, cfg: DatasetConfig, skip_ids: set[str], rank: RankSpec, source: LoadedSource | None) -> None:
        self._rejects: list[Reject] = []
        self._source = iter_prompts(cfg, skip_ids, SourceStats(), self._rejects, loaded=source,
                                    owns=rank.owns if rank.ranked else None)
        self._ahead: list[Prompt] | None = None

    async def first(self) -> list[Prompt]:
        """The first batch, read ahead (it sizes the controller's prior); abandoned when cancelled."""
        if self._ahead is None:
            self._ahead = await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True)
        return self._ahead

    async def next_batch(self) -> list[Prompt]:
        if self._ahead:
            batch, self._ahead = self._ahead, []
            return batch
        return await anyio.to_thread.run_sync(self._read)

    def take_rejects(self) -> list[Reject]:
        taken, self._rejects[:] = list(self._rejects), []
        return taken

    def _read(self) -> list[Prompt]:
        return list(islice(self._source, BATCH))


class DatasetRun:
    """One dataset of a job, from its opened store to its summary; `window` is the job's (shared)."""

    def __init__(self, cfg: DatasetConfig, opts: RunOptions, store: DatasetStore, skip_ids: set[str],
                 window: Window, source: LoadedSource | None = None, notes: list[str] | None = None) -> None:
        self.cfg, self.opts, self.store, self.window, self.name = cfg, opts, store, window, cfg.name
        self.notes = notes or []  # what opening the store repaired or noticed
        self.log = logging.LoggerAdapter(EVENTS, {"dataset": self.name})
        self.journal = logging.LoggerAdapter(JOURNAL, {"dataset": self.name})
        self.feed = Feed(cfg, skip_ids, opts.rank, source)
        self.done_at_start = store.done
        self.stats = RunStats()
        goal = store.remaining if opts.limit is None else min(store.remaining, opts.limit)
        self.dispatch = Dispatcher(goal, window, self.stats, self.name)
        self.handle: ServerHandle | None = None
        self.readers: Readers | None = None  # the job's reader processes (run/readers.py), once it has them
        self.started = False  # its producer has begun
        self.elapsed_s: float | None = None  # its time from its start to its last sample, once written
        self.telemetry = Telemetry(store.folder, run=store.run_number,
                                   on_event=lambda message: self.log.warning("%s", message))

    def start(self) -> None:
        """Its producer begins: its throughput and elapsed time count from now."""
        self.started = True
        self.stats.started = time.monotonic()
        self.store.record_generating()

    def snapshot(self, *, final: bool = False) -> RunSnapshot:
        """Now, with the server's load as the last successful poll saw it."""
        return self._snapshot(self.stats.last_load, final)

    def _snapshot(self, load: LoadSnapshot | None, final: bool = False) -> RunSnapshot:
        s, handle = self.stats, self.handle
        ctl = self.window.controller_stats()
        deciding = None if self.opts.window else ctl  # a fixed --window: the controller only observes
        sps, tps = s.average() if final else s.throughput()  # the final line: the whole run's average
        cap = handle.capacity if handle is not None else None
        info = handle.info if handle is not None else {}
        return RunSnapshot(
            done=self.store.done, target=self.store.target, samples_per_s=sps, tokens_per_s=tps,
            in_flight=self.dispatch.in_flight, window=self.window.size, label=self.name,
            time_s=time.time() if s.ended_wall is None else s.ended_wall,
            elapsed_s=s.elapsed_s(), completions=self.dispatch.ok, failures=s.failures,
            running=load.running if load else None, queued=load.queued if load else None,
            kv_used_tokens=load.used_tokens if load else None, kv_usage=load.token_usage if load else None,
            kv_capacity_tokens=(cap.max_total_num_tokens or None) if cap else None,
            max_running_requests=cap.max_running_requests if cap else None,
            cuda_graph_max_bs=cap.cuda_graph_max_bs if cap else None,
            gen_tokens_per_s=load.gen_throughput if load else None,
            retractions_total=load.retractions_total if load else None, retractions_run=s.retractions,
            controller_mode=deciding.mode if deciding else None,
            controller_reason=deciding.reason if deciding else None, fixed_window=bool(self.opts.window),
            tokens_per_request=ctl.tokens_per_request if ctl else None,
            held_tokens_per_request=ctl.held_tokens_per_request if ctl else None,
            kv_dtype=None if (dtype := info.get("kv_cache_dtype")) is None else str(dtype),
            mem_fraction_static=_float_or_none(info.get("mem_fraction_static")),
            restarts=handle.restarts if handle is not None else 0,
            peak_running=s.peak_running, peak_queued=s.peak_queued, peak_kv_usage=s.peak_kv_usage, final=final,
            server_wait_s=(time.monotonic() - handle.down_since_s
                           if handle is not None and handle.down_since_s is not None else None),
            server_wait_limit_s=handle.wait_limit_s if handle is not None else None, client_cpu=s.cpu.share(),
            front_end_cpu=s.front_end_cpu.share(handle.pid if handle is not None else None),
            spec_accept_length=load.spec_accept_length if load else None,
            readers=len(self.readers.live) if self.readers is not None else 0)

    def progress_record(self) -> ProgressRecord:
        return progress_record(self.snapshot())

    def observe_poll(self, snap: LoadSnapshot | None) -> None:
        """One load poll while it is active (None: it failed): its stats, telemetry and the load observers."""
        if snap is not None:
            self.stats.note_load(snap)
        snapshot = self._snapshot(snap)
        self.telemetry.poll(snapshot)
        for observe in self.opts.load_observers:
            observe(snapshot)

    def initial_tokens(self, first: list[Prompt]) -> float:
        """Tokens a request holds at its end, before any completion: errs low (half the output cap)."""
        cap = sum(share * min(s.max_new_tokens, 4096) for share, s in self.cfg.variants)
        return max(64.0, estimate_prompt_tokens(first) + 0.5 * cap)

    async def write(self, recv: MemoryObjectReceiveStream[Item], signal: Callable[[], str | None]) -> None:
        """Its writer task: results to the store in batches, committed periodically, then closed (unlocked) as soon as
        its last request ended; raises the run's fatal error after a batch."""
        interval_s, last_commit = self.opts.commit_interval_s, time.monotonic()
        async with recv:
            while True:
                batch: list[Item] = []
                with anyio.move_on_after(interval_s):
                    try:
                        batch.append(await recv.receive())
                    except anyio.EndOfStream:
                        break
                while len(batch) < BATCH:
                    try:
                        batch.append(recv.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await anyio.to_thread.run_sync(self._write_batch, batch)
                if time.monotonic() - last_commit >= interval_s:
                    last_commit = time.monotonic()
                    await anyio.to_thread.run_sync(self.store.commit, self.progress_record())
                if self.stats.fatal is not None:
                    raise self.stats.fatal
        self.stats.end()
        self.elapsed_s = self.stats.elapsed_s()
        self.store.record_stop(self.stopped_by(signal()))
        with anyio.CancelScope(shield=True):  # the manifest must be committed even when cancelled
            await anyio.to_thread.run_sync(self.store.close, self.progress_record())

    def _write_batch(self, batch: list[Item]) -> None:
        store = self.store
        writes: list[tuple[type, Callable[[Any], object]]] = [
            (Sample, store.write_samples), (Failure, store.write_failures), (Reject, store.write_rejects)]
        for kind, write in writes:
            if items := [x for x in batch if isinstance(x, kind)]:
                write(items)

    def stopped_by(self, signal: str | None) -> str:
        """Why it ended: its target reached, the job's signal, its source exhausted, or --limit."""
        if self.dispatch.goal <= 0:
            return "nothing_to_do"
        if self.started and self.store.remaining == 0:
            return "target"
        if signal is not None:
            return signal
        if self.dispatch.exhausted:
            return "source_exhausted"
        return "limit" if self.store.remaining > 0 else "target"

    def summary(self, stopped_by: str) -> RunSummary:
        s, rank = self.stats, self.opts.rank
        elapsed_s = self.elapsed_s if self.elapsed_s is not None else s.elapsed_s() if self.started else 0.0
        # written: what the store holds now less what it held: a result the dispatcher counted but a second
        # signal cancelled before the writer took it (or a duplicate the store skipped) is not in it
        return RunSummary(self.name, self.store.done, self.store.target, written=self.store.done - self.done_at_start,
                          failures=s.failures, rejects=s.rejects, elapsed_s=elapsed_s,
                          stopped_by=stopped_by, failure_reasons=dict(s.failure_reasons),
                          final_failures=s.final_failures, rank_label=rank.label if rank.ranked else "")


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
