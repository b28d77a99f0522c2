"""The job: one anyio task group owns the server, the load poller, the reporter, the signals, the datasets'
producers and writers (a single dataset is a job of one). The datasets share one Window (one KV pool); dataset
k+1's producer starts the moment k has sent every prompt it needs, so the server never drains between them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from gen_pipeline.config.dataset import DatasetConfig
from gen_pipeline.config.mix import declared_lines
from gen_pipeline.controller import Controller
from gen_pipeline.errors import GenPipelineError, first_known
from gen_pipeline.http import open_http
from gen_pipeline.records import RunSnapshot
from gen_pipeline.reports.status import read_part_status
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.connect import ServerPoller, client_settings, max_connections, start_server
from gen_pipeline.run.dataset_run import BATCH, EVENTS, JOURNAL, DatasetRun
from gen_pipeline.run.dispatch import Item, produce_in_order
from gen_pipeline.run.options import JobSummary, RunOptions, RunSummary
from gen_pipeline.run.readers import open_readers
from gen_pipeline.run.setup import OpenedDatasets, SetupStopped, open_datasets
from gen_pipeline.run.shutdown import Shutdown
from gen_pipeline.server import ServerHandle
from gen_pipeline.store.layout import part_folder

REPORT_EVERY_S = 0.5  # RunOptions.on_progress


class Job:
    """The datasets of a job sharing one server, window and request task group; made by `open_job`."""

    def __init__(self, opened: OpenedDatasets, opts: RunOptions, shutdown: Shutdown | None = None) -> None:
        self.opts, self.http, self.model, self.waived = opts, opened.http, opened.model, opened.waived
        self.asked, self.all_runs = opened.asked, opened.runs
        self.runs = [r for r in self.all_runs if r.dispatch.goal > 0]  # those with something to do
        self.several = len(self.all_runs) > 1
        self.window = self.all_runs[0].window
        self.window.members = [r.dispatch for r in self.runs]
        self.shutdown = shutdown or Shutdown(opts.drain_grace_s)  # open_job's: it listens from set-up to close
        self.started: list[DatasetRun] = []
        self.handle: ServerHandle | None = None
        self._first_poll = anyio.Event()  # the display waits for it: its first line carries load figures
        self._said: tuple[str, str] | None = None  # the controller's mode and reason last journaled

    @property
    def folders(self) -> dict[str, Path]:
        """Each dataset's folder (a rank's part), where its run.log belongs."""
        return {r.name: r.store.folder for r in self.all_runs}

    def snapshot(self, *, final: bool = False) -> RunSnapshot:
        """The dataset being sent, as its RunSnapshot; a job of several sums its datasets' figures."""
        current = self.started[-1] if self.started else (self.runs or self.all_runs)[0]
        s = current.snapshot(final=final)
        if not self.several:
            return s
        names = [r.name for r in self.runs]
        label = (f"job ({', '.join(names)})" if final
                 else f"job {current.name} ({names.index(current.name) + 1}/{len(names)})")
        if final:  # the whole job's average: its datasets ran one after another, their rates do not add
            span = max((r.stats.elapsed_s() for r in self.started), default=0.0) or 1e-6
            rates = [(sum(r.stats.samples_total for r in self.started) / span,
                      sum(r.stats.tokens_total for r in self.started) / span)]
        else:
            rates = [r.stats.throughput() for r in self.started]
        return replace(s, label=label, done=sum(r.store.done for r in self.all_runs),
                       target=sum(r.store.target for r in self.all_runs), samples_per_s=sum(x[0] for x in rates),
                       tokens_per_s=sum(x[1] for x in rates), in_flight=sum(r.dispatch.in_flight for r in self.runs),
                       failures=sum(r.stats.failures for r in self.all_runs),
                       completions=sum(r.dispatch.ok for r in self.all_runs))

    async def run(self) -> JobSummary:
        """Generate every dataset up to its target (or --limit); raises the fatal GenPipelineError that ended it."""
        for r in self.all_runs:
            r.journal.info("run of %s: %s/%s samples done", r.name, f"{r.store.done:,}", f"{r.store.target:,}")
            for note in r.notes:
                r.log.info("%s: %s", r.name, note)
            if r.dispatch.goal <= 0 and self.several:
                r.log.info("%s: %s/%s samples, the target is already reached; skipping it.", r.name,
                           f"{r.store.done:,}", f"{r.store.target:,}")
        for problem in self.waived:
            JOURNAL.warning("%s (--proceed-anyway: generating anyway)", problem)
        if self.runs:
            await self._run_pending()
        summary = JobSummary()
        for r in self.all_runs:
            s = r.summary(r.stopped_by(self.shutdown.signal))
            r.store.record_stop(s.stopped_by)  # a dataset still open (its writer commits the others)
            r.journal.info("%s", s.line())
            summary.runs.append(s)
        return summary

    async def _run_pending(self) -> None:
        if self.several:
            EVENTS.info("job: %s; %s/%s samples done", ", ".join(r.name for r in self.runs),
                        f"{sum(r.store.done for r in self.all_runs):,}",
                        f"{sum(r.store.target for r in self.all_runs):,}")
        try:
            await self._main()
        except BaseExceptionGroup as group:
            error = first_known(group)
            JOURNAL.error("%s ended: %s", "job" if self.several else "run", error)
            raise error from None
        finally:
            fleet = self.handle.fleet if self.handle is not None else None
            if fleet is not None and fleet.routing == "affinity" and fleet.stayed + fleet.moved:
                JOURNAL.info("affinity: %s later turns went back to their previous turn's server, %s moved "
                             "(it was out, or its free KV more than %.0f %% of its capacity below the best's)",
                             f"{fleet.stayed:,}", f"{fleet.moved:,}", 100 * fleet.affinity_margin)
            if self.handle is not None:  # the last figures only once the server was up
                if self.opts.on_progress is not None:
                    self.opts.on_progress(self.snapshot(final=True))
                for r in self.started:
                    r.telemetry.poll(r.snapshot())  # the last row (done = target)

    async def _main(self) -> None:
        log_dir = self.runs[0].store.folder  # the job's server.log: in its first dataset's folder
        async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
            self.shutdown.startup_scope = tg.cancel_scope  # a signal now stops the start-up
            if self.shutdown.signal is not None:  # one came once the set-up had ended
                tg.cancel_scope.cancel()
            firsts = [await r.feed.first() for r in self.runs]  # a streaming source's read is abandoned
            self.handle = handle = await start_server(tg, self.opts, log_dir, self.http, self.model, self.asked,
                                                       [r.store.folder for r in self.all_runs])
            self.shutdown.serving = True
            # with a fixed --window the controller still observes (its estimate goes to the telemetry)
            controller = Controller(handle.capacity, config=self.opts.controller,
                                    initial_tokens_per_request=self.runs[0].initial_tokens(firsts[0]))
            gpus, how = handle.gpus(self.opts.gpus_per_server)
            for r, first in zip(self.runs, firsts, strict=True):
                controller.add_kind(r.name, r.initial_tokens(first))
                r.handle = handle
                r.store.record_server(tp_size=handle.info.get("tp_size"), dp_size=handle.info.get("dp_size"),
                                      servers=len(handle.load_urls), gpus=gpus, how=how)
            self.window.controller = controller
            self.window.retune(0)
            self._log_controller()
            connections = max_connections(self.opts, handle)
            async with open_readers(self.opts.readers, connect_timeout_s=self.runs[0].cfg.generation.connect_timeout_s,
                                    max_connections=connections) as readers:
                clients = []
                for r in self.runs:
                    r.readers = readers
                    session = await stack.enter_async_context(open_http(r.cfg.generation, connections))
                    clients.append(ChatClient(session, handle.base_urls, client_settings(handle, self.opts, r.cfg),
                                              gate=handle.wait_ready,
                                              on_request_done=partial(self.window.observe_completion, kind=r.name),
                                              fleet=handle.fleet, server_wait_s=self.opts.server_wait_s,
                                              readers=readers))
                tg.start_soon(self._poll_load)
                if self.opts.on_progress is not None:
                    tg.start_soon(self._report_progress, self.opts.on_progress)
                await self._work(clients)
            tg.cancel_scope.cancel()  # stops the server (once, for the whole job), the poller, the reporter

    async def _poll_load(self) -> None:
        """The server's live load every poll_interval_s, to the controller and each active dataset."""
        assert self.handle is not None
        poller = ServerPoller(self.handle, self.window, self.opts.poll_interval_s)
        while True:
            snap = await poller.next(self.http)
            if snap is not None:
                self.window.observe_load(snap)
            self.window.retune(0)
            self._first_poll.set()
            self._log_controller()
            active = [r for r in self.started if r.dispatch.in_flight or not r.dispatch.all_sent.is_set()]
            for r in active or self.started[-1:]:
                r.observe_poll(snap)

    def _log_controller(self) -> None:
        """The controller's mode and last decision, into run.log when they change."""
        stats = None if self.opts.window else self.window.controller_stats()
        if stats is None or (stats.mode, stats.reason) == self._said:
            return
        self._said = (stats.mode, stats.reason)
        JOURNAL.info("controller %s: %s (window %d)", stats.mode, stats.reason, self.window.size)

    async def _report_progress(self, on_progress: Callable[[RunSnapshot], None]) -> None:
        """The job's snapshot every REPORT_EVERY_S, from the first load poll on."""
        await self._first_poll.wait()
        while True:
            on_progress(self.snapshot())
            await anyio.sleep(REPORT_EVERY_S)

    async def _work(self, clients: list[ChatClient]) -> None:
        """Writers outside the requests' group (a drain deadline cancels only requests); producers in order."""
        by_dispatch = {id(r.dispatch): (r, c) for r, c in zip(self.runs, clients, strict=True)}
        async with anyio.create_task_group() as work:
            async with anyio.create_task_group() as requests:
                self.shutdown.requests_scope = requests.cancel_scope
                with self.shutdown.producer_scope:
                    await produce_in_order(requests, [r.dispatch for r in self.runs],
                                           lambda d: self._start(*by_dispatch[id(d)], work))

    def _start(self, r: DatasetRun, client: ChatClient, work: TaskGroup) -> tuple[Any, Any, Any]:
        """Dataset r begins: its writer starts; returns its producer's transport, stream and feed."""
        send, recv = anyio.create_memory_object_stream[Item](BATCH * 4)
        r.start()
        self.started.append(r)
        if self.several:
            r.log.info("%s: starting (%s/%s samples done)", r.name, f"{r.store.done:,}", f"{r.store.target:,}")
        if r.cfg.mix is not None:  # what each sample's sampling is drawn from (config/mix.py)
            r.log.info("%s: sampling mix: %s", r.name, "; ".join(declared_lines(r.cfg.mix)))
        work.start_soon(r.write, recv, lambda: self.shutdown.signal)
        return partial(client.regenerate, dataset=r.name), send, r.feed


class StoppedJob:
    """What open_job yields when a signal stopped the set-up: `run()` only reports each dataset as stopped."""

    def __init__(self, cfgs: Sequence[DatasetConfig], opts: RunOptions, signal: str, done: dict[str, int]) -> None:
        self.waived: list[GenPipelineError] = []  # as Job's: nothing was checked to the end
        self.summary = JobSummary()
        self.folders: dict[str, Path] = {}
        rank = opts.rank
        for cfg in cfgs:
            folder = part_folder(opts.output_root, cfg.name, rank)
            target = rank.share(cfg.target_samples)
            n = done[cfg.name] if cfg.name in done else read_part_status(folder, cfg.name, target).done
            self.summary.runs.append(RunSummary(cfg.name, n, target, stopped_by=signal,
                                                rank_label=rank.label if rank.ranked else ""))
            if folder.is_dir():  # a dataset a run wrote before: its run.log gets the summary too
                self.folders[cfg.name] = folder

    async def run(self) -> JobSummary:
        for s in self.summary.runs:
            JOURNAL.info("%s", s.line(), extra={"dataset": s.dataset})
        return self.summary


@asynccontextmanager
async def open_job(cfgs: Sequence[DatasetConfig], opts: RunOptions) -> AsyncIterator[Job | StoppedJob]:
    """A job set up for `job.run()` (no server started yet; `job.waived`: what --proceed-anyway let through), or a
    StoppedJob after a signal during the set-up. Raises the set-up's errors; every store is closed on the way out."""
    shutdown = Shutdown(opts.drain_grace_s)
    jobs: list[Job] = []
    error: GenPipelineError | None = None
    stopped: SetupStopped | None = None
    # signals are handled from the set-up to the last store closed (shutdown.py), those held before too
    def drain() -> None:
        for run in (r for j in jobs for r in j.runs):
            run.dispatch.draining = True

    async with anyio.create_task_group() as signals:
        await signals.start(shutdown.handle_signals, lambda: sum(r.dispatch.in_flight for j in jobs for r in j.runs),
                            drain)
        try:
            async with open_datasets(cfgs, opts, shutdown.setup_scope) as opened:
                jobs.append(Job(opened, opts, shutdown))
                yield jobs[0]
        except SetupStopped as e:
            stopped = e
        except GenPipelineError as e:
            error = e  # raised below: not wrapped in the task group's ExceptionGroup
        finally:
            signals.cancel_scope.cancel()
    if error is not None:
        raise error
    if stopped is not None:
        assert shutdown.signal is not None, "only a signal stops the set-up"
        yield StoppedJob(cfgs, opts, shutdown.signal, stopped.done)


async def run_job(cfgs: Sequence[DatasetConfig], opts: RunOptions) -> JobSummary:
    """Generate every dataset of `cfgs` up to its target through one server; resumable per dataset."""
    async with open_job(cfgs, opts) as job:
        return await job.run()


async def run_generate(cfg: DatasetConfig, opts: RunOptions) -> RunSummary:
    """Generate `cfg` up to its target (or opts.limit): a job of one. Raises GenPipelineError subclasses."""
    return (await run_job([cfg], opts)).runs[0]
