"""A job: several datasets through one server lifetime (`generate --dataset B1,B2,B6,B7`).

One server is launched (or attached) for the whole job and stopped once at the end; each dataset
keeps its own folder, manifest, lock, exact target, resume by id, drift check, run.log and
telemetry (the per-dataset parts are pipeline.py's `_Run`). Every store is opened (locks taken,
drift checked) before the server starts.

Dispatch order: one dataset after another, overlapped. The datasets share one Window (the KV pool
is one pool) and one request task group; dataset k+1's producer starts the moment dataset k has
sent every prompt it needs, so the slots k's tail frees are refilled with k+1's prompts and the
server never drains between datasets. The window is retuned with the sum of the datasets' needs,
and the controller sizes it from the length estimate of each dataset weighted by its requests in
flight (controller/core.py `set_mix`). Each dataset has its own ChatClient: its own sampling,
timeouts and retries. A retry of dataset k (a failed request) still goes out while k+1 runs.

Exit code: the worst of the datasets' (a signal's 130/143 over a short source's 5 over 0); a fatal
error (server gone, disk) ends the whole job with its own code, every store committed.
"""

from __future__ import annotations

import contextvars
import logging
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.controller import Controller
from gen_pipeline.http import Http, open_http
from gen_pipeline.records import Prompt, Sample
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.dispatch import Item, Window, produce_in_order
from gen_pipeline.run.options import RunOptions, RunSummary
from gen_pipeline.run.pipeline import (
    _BATCH,
    ControllerLog,
    ServerPoller,
    _client_settings,
    _first_known,
    _max_connections,
    _Run,
    _start_server,
    report_progress,
    run_log,
)
from gen_pipeline.run.progress import Figures, Progress
from gen_pipeline.run.shutdown import Shutdown
from gen_pipeline.server import ServerHandle
from gen_pipeline.server.attach import identify
from gen_pipeline.store.dataset_store import DatasetStore, default_opener

__all__ = ["JobSummary", "run_job"]

log = logging.getLogger("gen_pipeline.run.job")
_DATASET: contextvars.ContextVar[str | None] = contextvars.ContextVar("gen_pipeline_job_dataset", default=None)


@dataclass
class JobSummary:
    runs: list[RunSummary] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The worst dataset's: 143/130 (interrupted) over 5 (source short) over 0."""
        return max((r.exit_code for r in self.runs), default=0)

    def lines(self) -> list[str]:
        done, target = sum(r.done for r in self.runs), sum(r.target for r in self.runs)
        written = sum(r.written for r in self.runs)
        pct = 100.0 * done / target if target else 100.0
        tail = "every dataset at its target." if done >= target else "run the same command to resume."
        job = (f"job ({', '.join(r.dataset for r in self.runs)}): {done:,}/{target:,} samples ({pct:.1f}%), "
               f"+{written:,} this run; {tail}")
        return [r.line() for r in self.runs] + [job]


def _dataset_log_filter(name: str) -> logging.Filter:
    """run.log of one dataset: the job's own records and the server's, and those of this dataset only
    (tagged with extra={"dataset": ...}, or logged by a task of that dataset: its producer, requests, writer)."""
    f = logging.Filter()
    f.filter = lambda record: getattr(record, "dataset", _DATASET.get() or name) == name  # type: ignore[method-assign]
    return f


class _Job:
    """The datasets of a job sharing one server, one window and one request task group."""

    def __init__(self, runs: list[_Run], opts: RunOptions, all_runs: list[_Run]) -> None:
        self.runs, self.opts, self.all_runs = runs, opts, all_runs
        self.window = runs[0].window
        self.window.members = [r.dispatch for r in runs]
        self.shutdown = Shutdown(opts.drain_grace_s)
        for r in runs:
            r.shutdown = self.shutdown
        self.started: list[_Run] = []
        self.elapsed_s: dict[str, float] = {}  # a dataset's time from its start to its last sample
        self.handle: ServerHandle | None = None
        self._first_poll = anyio.Event()
        self._controller_log = ControllerLog()

    # ------------------------------------------------------------ figures
    def current(self) -> _Run:
        """The dataset being sent (the last one started)."""
        return self.started[-1] if self.started else self.runs[0]

    def figures(self, *, final: bool = False) -> Figures:
        """The job's figures: samples toward the job total; the live load from the current dataset."""
        f = self.current().figures(final=final)
        done = sum(r.store.done for r in self.all_runs)
        target = sum(r.store.target for r in self.all_runs)
        sps = sum(r.stats.throughput()[0] for r in self.started)
        tps = sum(r.stats.throughput()[1] for r in self.started)
        in_flight = sum(r.dispatch.in_flight for r in self.runs)
        failures = sum(r.stats.failures for r in self.all_runs)
        return Figures(done=done, target=target, samples_per_s=sps, tokens_per_s=tps, in_flight=in_flight,
                       window=self.window.size, running=f.running, queued=f.queued, kv_usage=f.kv_usage,
                       retractions=f.retractions, failures=failures, controller_mode=f.controller_mode,
                       controller_reason=f.controller_reason, final=final, peak_running=f.peak_running,
                       peak_queued=f.peak_queued, peak_kv_usage=f.peak_kv_usage)

    def label(self) -> str:
        names = [r.cfg.name for r in self.runs]
        cur = self.current().cfg.name
        return f"job {cur} ({names.index(cur) + 1}/{len(names)})"

    # ------------------------------------------------------------ side tasks
    def _active(self) -> list[_Run]:
        return [r for r in self.started if r.dispatch.in_flight or not r.dispatch.all_sent.is_set()]

    async def poll_load(self, http: Http) -> None:
        """The server's live load every poll_interval_s: the controller, each active dataset's telemetry."""
        assert self.handle is not None
        poller = ServerPoller(self.handle, self.window, self.opts.poll_interval_s)
        while True:
            snap = await poller.next(http)
            active = self._active() or self.started[-1:]
            for r in active:
                if snap is not None:
                    r.stats.note_load(snap)
            if snap is not None:
                self.window.observe_load(snap)
            self.window.retune(0)
            self._first_poll.set()
            self._log_controller()
            for r in active:
                r._record_telemetry(snap)
                if self.opts.load_observers:
                    record = r.load_poll(snap)
                    for observe in self.opts.load_observers:
                        observe(record)

    def _log_controller(self) -> None:
        self._controller_log.note(None if self.opts.window else self.window.controller_stats(), self.window.size)

    async def report_progress(self, progress: Progress) -> None:
        await report_progress(progress, self._first_poll, self.figures, self.opts.on_figures, self.label)

    # ------------------------------------------------------------ main
    async def main(self, http: Http, progress: Progress) -> None:
        firsts = [await r.feed.first() for r in self.runs]
        log_dir = self.runs[0].store.folder  # the job's server.log: in its first dataset's folder
        async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
            self.handle = await _start_server(tg, self.opts, log_dir, http)
            controller = Controller(self.handle.capacity, config=self.opts.controller,
                                    initial_tokens_per_request=self.runs[0]._initial_tokens(firsts[0]))
            for r, first in zip(self.runs, firsts, strict=True):
                controller.add_kind(r.cfg.name, r._initial_tokens(first))
                r.handle = self.handle
            self.window.controller = controller
            self.window.retune(0)
            clients = []
            for r in self.runs:
                session = await stack.enter_async_context(
                    open_http(r.cfg.generation, _max_connections(self.opts, self.handle)))
                clients.append(ChatClient(session, self.handle.base_urls,
                                          _client_settings(self.handle, self.opts, r.cfg),
                                          gate=self.handle.wait_ready, on_request_done=self._observer(r.cfg.name),
                                          fleet=self.handle.fleet))
            tg.start_soon(self.poll_load, http)
            if progress.mode != "quiet" or self.opts.on_figures is not None:
                tg.start_soon(self.report_progress, progress)
            tg.start_soon(self.shutdown.handle_signals, self._in_flight, self._drain)
            await self._work(clients)
            tg.cancel_scope.cancel()  # stops the server (once, for the whole job), the poller, the reporter

    def _observer(self, name: str) -> Any:
        def observe(prompt_tokens: int, completion_tokens: int, latency_s: float) -> None:
            self.window.observe_completion(prompt_tokens, completion_tokens, latency_s, name)
        return observe

    def _in_flight(self) -> int:
        return sum(r.dispatch.in_flight for r in self.runs)

    def _drain(self) -> None:
        for r in self.runs:
            r.dispatch.draining = True

    async def _work(self, clients: list[ChatClient]) -> None:
        """Writers outside the requests' group (every finished sample is written); the producers in
        dataset order (dispatch.produce_in_order: the next starts once the previous has sent all)."""
        by_dispatch = {id(r.dispatch): (r, c) for r, c in zip(self.runs, clients, strict=True)}
        async with anyio.create_task_group() as work:
            async with anyio.create_task_group() as requests:
                self.shutdown.requests_scope = requests.cancel_scope
                with self.shutdown.producer_scope:
                    await produce_in_order(requests, [r.dispatch for r in self.runs],
                                           lambda d: self._start(*by_dispatch[id(d)], work))

    def _start(self, r: _Run, client: ChatClient, work: Any) -> tuple[Any, Any, Any]:
        """Dataset r begins: its writer starts; returns its transport, stream and feed for its producer."""
        send, recv = anyio.create_memory_object_stream[Item](_BATCH * 4)
        name = r.cfg.name
        now = time.monotonic()
        r.stats.started, r.telemetry.started_s = now, now
        self.started.append(r)
        log.info("%s: starting (%s/%s samples done)", name, f"{r.store.done:,}", f"{r.store.target:,}",
                 extra={"dataset": name})

        async def regenerate(prompt: Prompt) -> Sample | Any:
            _DATASET.set(name)  # its log records go to its own run.log
            return await client.regenerate(prompt, name)

        async def write() -> None:
            _DATASET.set(name)
            await r.writer.run(recv)
            # every request of this dataset has ended: commit and unlock it now (status shows it done)
            self.elapsed_s[name] = r.stats.elapsed_s()
            r.store.record_stop(self.stopped_by(r))
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(r.store.close, r.progress_dict())

        work.start_soon(write)
        return regenerate, send, r.feed

    def stopped_by(self, r: _Run) -> str:
        if r in self.started and r.store.remaining == 0:
            return "target"
        if self.shutdown.signal is not None:
            return self.shutdown.signal
        return r.stopped_by()


async def _model(opts: RunOptions, http: Http) -> str:
    if opts.model:
        return opts.model
    if opts.server_urls:
        return await identify(http, opts.server_urls[0].rstrip("/"))
    assert opts.profile is not None, "RunOptions needs server_urls or a profile"
    return opts.profile.request_model


def _store(cfg: DatasetConfig, opts: RunOptions, model: str) -> DatasetStore:
    return DatasetStore(opts.output_root, cfg.name, fingerprint=cfg.fingerprint(model), target=cfg.target_samples,
                        shard_max_samples=cfg.output.shard_max_samples, fsync_every=cfg.output.fsync_every,
                        file_opener=opts.file_opener or default_opener, rank=opts.rank)


async def run_job(cfgs: list[DatasetConfig], opts: RunOptions) -> JobSummary:
    """Generate every dataset of `cfgs` up to its target through one server; resumable per dataset."""
    total = sum(c.target_samples for c in cfgs)
    with Progress("job", 0, total, mode=opts.progress) as progress, ExitStack() as logs:
        async with open_http(cfgs[0].generation, 16) as http:  # control traffic
            model = await _model(opts, http)
            runs: list[_Run] = []
            try:
                window = Window(fixed=opts.window)
                for cfg in cfgs:  # every lock and drift check before the server starts
                    store = _store(cfg, opts, model)
                    state = await anyio.to_thread.run_sync(store.open)
                    runs.append(_Run(cfg, opts, store, set(state.done_ids) | store.final_failure_ids(), window))
                    logs.enter_context(run_log(store.folder, _dataset_log_filter(cfg.name)))
                    for note in state.notes:
                        log.info("%s: %s", cfg.name, note, extra={"dataset": cfg.name})
                return await _run_opened(runs, opts, http, progress)
            finally:
                with anyio.CancelScope(shield=True):
                    for r in runs:
                        keep = r.keep_last_figures or r.stats.elapsed_s() <= 0 or r.dispatch.ok == 0
                        await anyio.to_thread.run_sync(r.store.close, None if keep else r.progress_dict())
                    for r in runs:
                        r.telemetry.close()


async def _run_opened(runs: list[_Run], opts: RunOptions, http: Http,
                      progress: Progress) -> JobSummary:
    pending = [r for r in runs if r.dispatch.goal > 0]
    for r in runs:
        if r.dispatch.goal <= 0:
            r.keep_last_figures = True  # status keeps showing the last real run's throughput
            log.info("%s: %s/%s samples, the target is already reached; skipping it.", r.cfg.name,
                     f"{r.store.done:,}", f"{r.store.target:,}", extra={"dataset": r.cfg.name})
    job = _Job(pending, opts, runs) if pending else None
    if job is not None:
        log.info("job: %s; %s/%s samples done", ", ".join(r.cfg.name for r in pending),
                 f"{sum(r.store.done for r in runs):,}", f"{sum(r.store.target for r in runs):,}")
        try:
            await job.main(http, progress)
        except BaseExceptionGroup as group:
            error = _first_known(group)
            log.error("job ended: %s", error, extra={"console": False})
            raise error from None
        finally:
            if job.handle is not None:
                progress.set_label(f"job ({', '.join(r.cfg.name for r in pending)})")
                progress.update(job.figures(final=True))
                for r in job.started:
                    r._record_telemetry(r.stats.last_load)
        progress.close()
    summary = JobSummary()
    for r in runs:
        stopped = "nothing_to_do" if r.dispatch.goal <= 0 else job.stopped_by(r) if job else "nothing_to_do"
        s = r.summary(stopped)
        if job is None or r not in job.started:
            s.elapsed_s = 0.0
        elif r.cfg.name in job.elapsed_s:
            s.elapsed_s = job.elapsed_s[r.cfg.name]
        r.store.record_stop(s.stopped_by)
        log.info("%s", s.line(), extra={"console": False, "dataset": r.cfg.name})
        summary.runs.append(s)
    return summary
