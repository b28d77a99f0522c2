"""The run: one anyio task group that owns the server, the producer, the requests, the
writer, the load poller, the progress reporter and the signal handler.

The parts, each owning one thing: `Dispatcher` + `Window` (dispatch.py: exactly-target accounting,
the controller's window), `BatchWriter` (writer.py), `RunStats` (run_stats.py: throughput, failure
reasons, the fatal streak), `Shutdown` (shutdown.py: signals), server start-up (`_start_server`
below). This module is the only one that opens task groups.

Shutdown: target reached → the producer stops once nothing is in flight, the writer drains its
stream, then the server, poller and reporter are cancelled. First SIGINT or SIGTERM → stop
dispatching, let in-flight requests finish for `drain_grace_s`, then cancel them (the writer still
writes every finished sample); a second signal cancels at once. A fatal error (server gone for
good, disk full) cancels everything. The store is closed (fsync + manifest) under a shield.

Events go to the `gen_pipeline` logger; `outputs/<DATASET>/run.log` collects them across runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from anyio.abc import TaskGroup

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.controller import Controller, ControllerStats
from gen_pipeline.errors import GenPipelineError
from gen_pipeline.records import Failure, LoadSnapshot, Prompt, Reject, Sample
from gen_pipeline.run.chat import ChatClient, ClientSettings, open_http_session
from gen_pipeline.run.dispatch import Dispatcher, Item, Window
from gen_pipeline.run.options import LoadPoll, RunOptions, RunSummary
from gen_pipeline.run.progress import Figures, Progress
from gen_pipeline.run.shutdown import Shutdown
from gen_pipeline.run.stats import RunStats
from gen_pipeline.run.writer import BatchWriter
from gen_pipeline.server import ServerHandle, run_attached, run_server
from gen_pipeline.server.attach import identify
from gen_pipeline.server.fleet_watch import read_fleet_load
from gen_pipeline.sources.loading import SourceStats, estimate_prompt_tokens, iter_prompts
from gen_pipeline.store.dataset_store import DatasetStore, default_opener
from gen_pipeline.store.ranks import RankSpec
from gen_pipeline.store.telemetry import Telemetry

__all__ = ["RunOptions", "RunSummary", "run_generate"]

log = logging.getLogger(__name__)
RUN_LOG_NAME = "run.log"
_BATCH = 256  # prompts pulled from the source per thread hop
_REPORT_EVERY_S = 0.5
_FIRST_POLL_S = 0.25  # a short run still gets a load poll while its requests are in flight


class _Feed:
    """The source's prompts in batches (read in a thread), and the rows it rejected meanwhile."""

    def __init__(self, cfg: DatasetConfig, skip_ids: set[str], rank: RankSpec) -> None:
        self._rejects: list[Reject] = []
        self._source = iter_prompts(cfg, skip_ids, SourceStats(), self._rejects,
                                    owns=rank.owns if rank.ranked else None)
        self._ahead: list[Prompt] | None = None

    async def first(self) -> list[Prompt]:
        """The first batch, read ahead (it sizes the controller's prior); next_batch() returns it first."""
        if self._ahead is None:
            self._ahead = await anyio.to_thread.run_sync(self._read)
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
        return list(islice(self._source, _BATCH))


class _Run:
    """One dataset's run: wires the parts together; its methods are the tasks of the task group."""

    def __init__(self, cfg: DatasetConfig, opts: RunOptions, store: DatasetStore, skip_ids: set[str],
                 window: Window | None = None):
        self.cfg, self.opts, self.store = cfg, opts, store
        self.feed = _Feed(cfg, skip_ids, opts.rank)
        self.stats = RunStats()
        self.window = window or Window(fixed=opts.window)  # a job's datasets share one
        goal = store.remaining if opts.limit is None else min(store.remaining, opts.limit)
        self.dispatch = Dispatcher(goal, self.window, self.stats, cfg.name)
        self.shutdown = Shutdown(opts.drain_grace_s)
        self.writer = BatchWriter(store, opts.commit_interval_s, self.progress_dict, self._raise_fatal)
        self.handle: ServerHandle | None = None
        self.keep_last_figures = False
        self._controller_log = ControllerLog()
        self._first_poll = anyio.Event()  # the display waits for it: its first line carries load figures
        self.telemetry = Telemetry(store.folder, run=store.run_number, started_s=time.monotonic(),
                                   on_event=lambda message: log.warning("%s", message))

    # ------------------------------------------------------------ figures
    def figures(self, *, final: bool = False) -> Figures:
        s, ctl = self.stats, self._deciding_controller()
        load = s.last_load
        sps, tps = s.throughput()
        return Figures(done=self.store.done, target=self.store.target, samples_per_s=sps,
                       tokens_per_s=tps, in_flight=self.dispatch.in_flight, window=self.window.size,
                       running=load.running if load else None, queued=load.queued if load else None,
                       kv_usage=load.token_usage if load else None,
                       retractions=self.telemetry.retractions, failures=s.failures,  # this run's, not the server's
                       controller_mode=ctl.mode if ctl else None, controller_reason=ctl.reason if ctl else None,
                       final=final, peak_running=s.peak_running, peak_queued=s.peak_queued,
                       peak_kv_usage=s.peak_kv_usage)

    def progress_dict(self) -> dict[str, Any]:
        f = self.figures()
        return {"samples_per_s": round(f.samples_per_s, 4), "tokens_per_s": round(f.tokens_per_s, 1),
                "in_flight": f.in_flight, "window": f.window, "failures": self.stats.failures,
                "written_this_run": self.dispatch.ok, "elapsed_s": round(self.stats.elapsed_s(), 1),
                "updated_at": time.time()}

    def _raise_fatal(self) -> None:
        if self.stats.fatal is not None:
            raise self.stats.fatal

    # ------------------------------------------------------------ side tasks
    async def poll_load(self, http: aiohttp.ClientSession) -> None:
        """Feed the controller with the server's live load every poll_interval_s; tell the observers."""
        assert self.handle is not None
        poller = ServerPoller(self.handle, self.window, self.opts.poll_interval_s)
        while True:
            snap = await poller.next(http)
            if snap is not None:
                self.stats.note_load(snap)
            self.dispatch.observe_load(snap)
            self._first_poll.set()
            self._log_controller()
            self._record_telemetry(snap)
            if self.opts.load_observers:
                record = self.load_poll(snap)
                for observe in self.opts.load_observers:
                    observe(record)

    def _deciding_controller(self) -> ControllerStats | None:
        """The controller's statistics when it sizes the window (None under a fixed --window)."""
        return None if self.opts.window else self.window.controller_stats()

    def _record_telemetry(self, snap: LoadSnapshot | None) -> None:
        """One row of outputs/<DATASET>/telemetry.jsonl (queued for its thread; never raises)."""
        self.telemetry.poll(self.figures(), snap, self.window.controller_stats(), self.handle,
                            fixed_window=bool(self.opts.window))

    def load_poll(self, snap: LoadSnapshot | None) -> LoadPoll:
        ctl = self._deciding_controller()
        assert self.handle is not None
        return LoadPoll(
            time_s=time.time(), window=self.window.size, in_flight=self.dispatch.in_flight,
            running=snap.running if snap else None, queued=snap.queued if snap else None,
            kv_used_tokens=snap.used_tokens if snap else None, kv_usage=snap.token_usage if snap else None,
            kv_capacity_tokens=self.handle.capacity.max_total_num_tokens or None,
            gen_tokens_per_s=snap.gen_throughput if snap else None,
            retractions_total=snap.retractions_total if snap else None, completions=self.dispatch.ok,
            controller_mode=ctl.mode if ctl else None, controller_reason=ctl.reason if ctl else None)

    def _log_controller(self) -> None:
        self._controller_log.note(self._deciding_controller(), self.window.size)

    async def report_progress(self, progress: Progress) -> None:
        await report_progress(progress, self._first_poll, self.figures, self.opts.on_figures)

    # ------------------------------------------------------------ main
    async def main(self, http: aiohttp.ClientSession, progress: Progress) -> None:
        first = await self.feed.first()
        try:
            async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
                self.handle = await _start_server(tg, self.opts, self.store.folder, http)
                # with a fixed --window the controller still observes: its tokens-per-request estimate
                # goes to the telemetry (diagnose's C/F), its window is not used
                self.window.controller = Controller(self.handle.capacity, config=self.opts.controller,
                                                    initial_tokens_per_request=self._initial_tokens(first))
                self.window.retune(self.dispatch.need())
                self._log_controller()
                requests_http = await stack.enter_async_context(
                    open_http_session(self.cfg.generation, _max_connections(self.opts, self.handle)))
                client = ChatClient(requests_http, self.handle.base_urls,
                                    _client_settings(self.handle, self.opts, self.cfg),
                                    gate=self.handle.wait_ready, on_request_done=self.window.observe_completion,
                                    fleet=self.handle.fleet)
                tg.start_soon(self.poll_load, http)
                if progress.mode != "quiet" or self.opts.on_figures is not None:
                    tg.start_soon(self.report_progress, progress)
                tg.start_soon(self.shutdown.handle_signals, lambda: self.dispatch.in_flight, self._drain)
                await self._work(client)
                tg.cancel_scope.cancel()  # stops the server, the poller and the reporter
        finally:
            if self.handle is not None:  # the bar (or last log line) only once the server was up
                progress.update(self.figures(final=True))
                self._record_telemetry(self.stats.last_load)  # the last figures (done = target)
            self.telemetry.close()

    def _drain(self) -> None:
        self.dispatch.draining = True

    async def _work(self, client: ChatClient) -> None:
        """Producer and requests in an inner group (a drain deadline cancels only them); the writer
        outside it, so every finished sample is written before the run ends."""
        send, recv = anyio.create_memory_object_stream[Item](_BATCH * 4)
        name = self.cfg.name

        async def regenerate(prompt: Prompt) -> Sample | Failure:
            return await client.regenerate(prompt, name)

        async with anyio.create_task_group() as work:
            work.start_soon(self.writer.run, recv)
            async with anyio.create_task_group() as requests:
                self.shutdown.requests_scope = requests.cancel_scope
                with self.shutdown.producer_scope:
                    await self.dispatch.produce(requests, regenerate, send, self.feed)

    def _initial_tokens(self, first: list[Prompt]) -> float:
        """Tokens a request holds at its end, before any completion: errs low (half the output cap)."""
        max_new = self.cfg.sampling.max_new_tokens
        return max(64.0, estimate_prompt_tokens(first) + 0.5 * min(max_new, 4096))

    def stopped_by(self) -> str:
        if self.shutdown.signal is not None:
            return self.shutdown.signal
        if self.dispatch.exhausted:
            return "source_exhausted"
        return "limit" if self.store.remaining > 0 else "target"

    def summary(self, stopped_by: str | None = None) -> RunSummary:
        s = self.stats
        return RunSummary(self.cfg.name, self.store.done, self.store.target, written=self.dispatch.ok,
                          failures=s.failures, rejects=s.rejects, elapsed_s=s.elapsed_s(),
                          stopped_by=stopped_by or self.stopped_by(), failure_reasons=dict(s.failure_reasons),
                          final_failures=s.final_failures)


class ControllerLog:
    """The controller's mode and last decision, into run.log when they change (not the console)."""

    def __init__(self) -> None:
        self._said: tuple[str, str] | None = None

    def note(self, stats: ControllerStats | None, window: int) -> None:
        if stats is None or (stats.mode, stats.reason) == self._said:
            return
        self._said = (stats.mode, stats.reason)
        log.info("controller %s: %s (window %d)", stats.mode, stats.reason, window, extra={"console": False})


async def report_progress(progress: Progress, first_poll: anyio.Event, figures: Callable[[], Figures],
                          on_figures: Callable[[Figures], None] | None,
                          label: Callable[[], str] | None = None) -> None:
    """The display every _REPORT_EVERY_S, from the first load poll on (its first line has load figures)."""
    await first_poll.wait()
    while True:
        if label is not None:
            progress.set_label(label())
        now = figures()
        progress.update(now)
        if on_figures is not None:
            on_figures(now)
        await anyio.sleep(_REPORT_EVERY_S)


class ServerPoller:
    """The server side of each load poll, for one dataset's run and for a job: waits for the next
    poll (the first one early, so a short run gets load figures), tells the controller when the
    capacity changed (a server restarted, the fleet lost or gained one), tells the fleet the KV a
    request holds, and reads the load summed over the fleet."""

    def __init__(self, handle: ServerHandle, window: Window, interval_s: float) -> None:
        self.handle, self.window, self.interval_s = handle, window, interval_s
        self._capacity = handle.capacity
        self._delay_s = min(_FIRST_POLL_S, interval_s)

    async def next(self, http: aiohttp.ClientSession) -> LoadSnapshot | None:
        """The next poll's load; None while the server is down or restarting (the controller then
        decides nothing: a restarting server's figures say nothing about the pool)."""
        await anyio.sleep(self._delay_s)
        self._delay_s = self.interval_s
        handle, controller = self.handle, self.window.controller
        if not handle.ready:
            return None
        if handle.capacity is not self._capacity and controller is not None:
            self._capacity = handle.capacity
            controller.update_capacity(handle.capacity)
        ctl = self.window.controller_stats()
        if handle.fleet is not None and ctl is not None and ctl.held_tokens_per_request > 0:
            handle.fleet.tokens_per_request = ctl.held_tokens_per_request  # KV a request sent holds
        return await read_fleet_load(http, handle, time.monotonic())


# ---------------------------------------------------------------- server start-up

async def _start_server(tg: TaskGroup, opts: RunOptions, log_dir: Path, http: aiohttp.ClientSession) -> ServerHandle:
    """Attach to opts.server_urls or launch opts.profile; returns once the server answers /health."""
    handle: ServerHandle
    if opts.server_urls:
        handle = await tg.start(_attached, list(opts.server_urls), http)
        return handle
    assert opts.profile is not None
    handle = await tg.start(_launched, opts, log_dir, http)
    return handle


async def _attached(urls: list[str], http: aiohttp.ClientSession, *, task_status: Any) -> None:
    await run_attached(urls, http=http, task_status=task_status)


async def _launched(opts: RunOptions, log_dir: Path, http: aiohttp.ClientSession, *, task_status: Any) -> None:
    assert opts.profile is not None
    await run_server(opts.profile, log_dir=log_dir, http=http, task_status=task_status)


def _max_connections(opts: RunOptions, handle: ServerHandle) -> int:
    """One connection per request in flight: the window's ceiling (fixed, or the server's slots + slack)."""
    if opts.window:
        return opts.window
    return max(64, min(4096, 2 * (handle.capacity.max_running_requests or 1024)))


def _client_settings(handle: ServerHandle, opts: RunOptions, cfg: DatasetConfig) -> ClientSettings:
    info = handle.info
    # a launched server's backend is what its profile says (the simulator's says "sim")
    backend = opts.profile.backend if opts.profile else str(info.get("backend", "openai"))
    return ClientSettings(model=handle.model or opts.model, backend=backend,
                          sampling=cfg.sampling, generation=cfg.generation,
                          kv_cache_dtype=str(info.get("kv_cache_dtype") or "unknown"))


# ---------------------------------------------------------------- the entry point

@contextmanager
def run_log(folder: Path, only: logging.Filter | None = None) -> Iterator[None]:
    """Append the `gen_pipeline` logger's records to folder/run.log (UTC timestamps) while inside
    (those `only` passes: a job's dataset keeps its own)."""
    handler = logging.FileHandler(folder / RUN_LOG_NAME, mode="a", encoding="utf-8", delay=True)
    if only is not None:
        handler.addFilter(only)
    formatter = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logger = logging.getLogger("gen_pipeline")
    logger.addHandler(handler)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


async def run_generate(cfg: DatasetConfig, opts: RunOptions) -> RunSummary:
    """Generate `cfg` up to its target (or --limit); resumable. Raises GenPipelineError subclasses."""
    # the display from the start: an attach that waits for a loading server says so
    with Progress(cfg.name, 0, cfg.target_samples, mode=opts.progress) as progress:
        async with open_http_session(cfg.generation, 16) as http:  # control traffic: health, loads, model
            model = opts.model
            if not model:
                if opts.server_urls:
                    model = await identify(http, opts.server_urls[0].rstrip("/"))
                else:
                    assert opts.profile is not None, "RunOptions needs server_urls or a profile"
                    model = opts.profile.request_model
            store = DatasetStore(opts.output_root, cfg.name, fingerprint=cfg.fingerprint(model),
                                 target=cfg.target_samples, shard_max_samples=cfg.output.shard_max_samples,
                                 fsync_every=cfg.output.fsync_every,
                                 file_opener=opts.file_opener or default_opener, rank=opts.rank)
            state = await anyio.to_thread.run_sync(store.open)
            with run_log(store.folder):
                return await _run_opened(cfg, opts, store, set(state.done_ids) | store.final_failure_ids(),
                                         state.notes, http, progress)


async def _run_opened(cfg: DatasetConfig, opts: RunOptions, store: DatasetStore, skip_ids: set[str],
                      notes: list[str], http: aiohttp.ClientSession, progress: Progress) -> RunSummary:
    log.info("run of %s: %s/%s samples done", cfg.name, f"{store.done:,}", f"{store.target:,}",
             extra={"console": False})
    for note in notes:
        log.info("%s", note)
    run = _Run(cfg, opts, store, skip_ids)
    try:
        if run.dispatch.goal <= 0:
            run.keep_last_figures = True  # status keeps showing the last real run's throughput
            summary = run.summary("nothing_to_do")
            store.record_stop(summary.stopped_by)
        else:
            try:
                await run.main(http, progress)
            except BaseExceptionGroup as group:
                error = _first_known(group)
                log.error("run ended: %s", error, extra={"console": False})
                raise error from None
            progress.close()  # the last figures before the summary
            summary = run.summary()
            store.record_stop(summary.stopped_by)  # status says "source exhausted" from this
        log.info("%s", summary.line(), extra={"console": False})
        return summary
    finally:
        with anyio.CancelScope(shield=True):  # the manifest must be committed even when cancelled
            await anyio.to_thread.run_sync(store.close, None if run.keep_last_figures else run.progress_dict())


def _first_known(group: BaseExceptionGroup) -> BaseException:
    """Task groups wrap errors in groups: surface our own error (the CLI has a message for it)."""
    matched: BaseException | None = group.split(GenPipelineError)[0]
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]
    return matched if matched is not None else group
