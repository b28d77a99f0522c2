"""The run: one anyio task group that owns the server, the producer, the requests, the
writer, the load poller, the progress reporter and the signal handler.

Exactly-target dispatch: a prompt is only sent while `ok + in_flight < goal`, where `ok` counts
samples produced this run (written or about to be) and `goal` is what the store still needs
(capped by --limit). A failure frees its place, so the producer sends another prompt. The
CapacityLimiter's size is the controller's window; the producer takes a token per request.

Shutdown: target reached → the producer stops once nothing is in flight, the writer drains its
stream, then the server, poller and reporter are cancelled. First SIGINT or SIGTERM → stop
dispatching, let in-flight requests finish for `drain_grace_s`, then cancel them (the writer still
writes every finished sample); a second signal cancels at once. A fatal error (server gone for
good, disk full) cancels everything. The store is closed (fsync + manifest) under a shield.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from contextlib import AsyncExitStack
from itertools import islice
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .client import ChatClient, ClientSettings, make_http_client
from .config import DatasetConfig
from .controller import Controller
from .errors import GenPipelineError, ServerError
from .progress import Figures, Progress
from .records import Failure, Prompt, Reject, Sample
from .run import RunOptions, RunSummary
from .server import ServerHandle, read_load, run_attached, run_server
from .server.profile import ServerProfile
from .sources import SourceStats, estimate_prompt_tokens, iter_prompts
from .store import DatasetStore, default_opener
from .transport import AiohttpTransport

__all__ = ["RunOptions", "RunSummary", "identify_model", "run_generate"]

Item = Sample | Failure | Reject
_BATCH = 256  # prompts pulled from the source per thread hop; samples written per batch
_FAILURE_STREAK_FATAL = 50  # this many failures in a row, none succeeding: the server is unusable


class _Run:
    """State of one run; methods are the tasks of the task group."""

    def __init__(self, cfg: DatasetConfig, opts: RunOptions, store: DatasetStore, skip_ids: set[str],
                 on_event: Any):
        self.cfg, self.opts, self.store, self.on_event = cfg, opts, store, on_event
        self.skip_ids = skip_ids
        self.goal = store.remaining if opts.limit is None else min(store.remaining, opts.limit)
        self.ok = 0  # samples produced this run
        self.in_flight = 0
        self.failures = 0
        self.failure_reasons: dict[str, int] = {}
        self.failure_streak = 0
        self.final_failures = 0
        self.rejects = 0
        self.stats = SourceStats()
        self.stopped_by = "target"
        self.started = time.monotonic()
        self._recent: deque[tuple[float, int]] = deque(maxlen=512)  # (t, completion tokens) per sample
        self._changed = anyio.Event()
        self._draining = False
        self.keep_last_figures = False
        self.controller: Controller | None = None
        self.limiter = anyio.CapacityLimiter(1)
        self.handle: ServerHandle | None = None
        self.last_load = None
        self.fatal: BaseException | None = None
        self._rejects_buffer: list[Reject] = []
        self._producer_scope = anyio.CancelScope()
        self._requests_scope = anyio.CancelScope()  # replaced by the requests task group's scope

    # ------------------------------------------------------------ figures
    def throughput(self) -> tuple[float, float]:
        """(samples/s, completion tokens/s) over the last minute of completions."""
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > 60.0:
            self._recent.popleft()
        # a full deque covers less than a minute (fast runs): measure from its oldest entry
        full = len(self._recent) == self._recent.maxlen
        span = max(now - (self._recent[0][0] if full else max(self.started, now - 60.0)), 1e-6)
        return len(self._recent) / span, sum(tokens for _, tokens in self._recent) / span

    def figures(self) -> Figures:
        sps, tps = self.throughput()
        load = self.last_load
        return Figures(done=self.store.done, target=self.store.target, samples_per_s=sps,
                       tokens_per_s=tps, in_flight=self.in_flight, window=int(self.limiter.total_tokens),
                       running=load.running if load else None, queued=load.queued if load else None,
                       kv_usage=load.token_usage if load else None,
                       retractions=load.retractions_total if load else None, failures=self.failures)

    def progress_dict(self) -> dict[str, Any]:
        f = self.figures()
        return {"samples_per_s": round(f.samples_per_s, 4), "tokens_per_s": round(f.tokens_per_s, 1),
                "in_flight": f.in_flight, "window": f.window, "failures": self.failures,
                "written_this_run": self.ok, "elapsed_s": round(time.monotonic() - self.started, 1),
                "updated_at": time.time()}

    # ------------------------------------------------------------ window
    def retune(self) -> None:
        need = self.goal - self.ok
        if self.opts.window:
            window = self.opts.window
        else:
            assert self.controller is not None
            window = self.controller.window(time.monotonic(), max(need, 1))
        self.limiter.total_tokens = max(1, min(window, max(need, 1)))

    def _notify(self) -> None:
        ev, self._changed = self._changed, anyio.Event()
        ev.set()

    def on_request_done(self, prompt_tokens: int, completion_tokens: int, latency_s: float) -> None:
        if self.controller is not None:
            self.controller.observe_completion(time.monotonic(), prompt_tokens, completion_tokens, latency_s)

    # ------------------------------------------------------------ producer + requests
    async def produce(self, tg: TaskGroup, client: ChatClient, send: MemoryObjectSendStream[Item],
                      first: list[Prompt], source: Any) -> None:
        pending = deque(first)
        async with send:
            await self._send_rejects(send)
            while not self._draining:
                token = object()
                await self.limiter.acquire_on_behalf_of(token)
                if self.ok + self.in_flight >= self.goal:
                    self.limiter.release_on_behalf_of(token)
                    if self.in_flight == 0:
                        return
                    await self._changed.wait()
                    continue
                if not pending:
                    pending.extend(await anyio.to_thread.run_sync(lambda: list(islice(source, _BATCH))))
                    await self._send_rejects(send)
                if not pending:
                    self.limiter.release_on_behalf_of(token)
                    self.stopped_by = "source_exhausted"
                    return
                self.in_flight += 1
                tg.start_soon(self.request, client, pending.popleft(), token, send.clone())

    async def _send_rejects(self, send: MemoryObjectSendStream[Item]) -> None:
        pending, self._rejects_buffer[:] = list(self._rejects_buffer), []
        self.rejects += len(pending)
        for reject in pending:
            await send.send(reject)

    async def request(self, client: ChatClient, prompt: Prompt, token: object,
                      send: MemoryObjectSendStream[Item]) -> None:
        async with send:
            try:
                result = await client.regenerate(prompt, self.cfg.name)
            finally:
                self.in_flight -= 1
                self.limiter.release_on_behalf_of(token)
            if isinstance(result, Sample):
                self.ok += 1
                self.failure_streak = 0
                self._recent.append((time.monotonic(), result.meta["completion_tokens"]))
            else:
                self._count_failure(result)
            self.retune()
            self._notify()
            await send.send(result)

    def _count_failure(self, failure: Failure) -> None:
        self.failures += 1
        self.final_failures += not failure.retryable
        self.failure_reasons[failure.reason] = self.failure_reasons.get(failure.reason, 0) + 1
        self.failure_streak += 1
        # never worked in this run, or stopped working for a long stretch
        streak = self.failure_streak
        if (self.ok == 0 and streak >= _FAILURE_STREAK_FATAL) or streak >= 4 * _FAILURE_STREAK_FATAL:
            self.fatal = ServerError(
                f"The last {self.failure_streak} requests all failed (latest: {failure.reason}: {failure.detail}). "
                "The server is not usable as configured: check SERVER_URL, the model name and the server log. "
                "Nothing written is lost; run the same command to resume.")

    # ------------------------------------------------------------ writer
    async def write(self, recv: MemoryObjectReceiveStream[Item]) -> None:
        """Batches results to the store until every request stream is closed; commits with live figures."""
        last_commit = time.monotonic()
        async with recv:
            while True:
                batch: list[Item] = []
                with anyio.move_on_after(self.opts.commit_interval_s):
                    try:
                        batch.append(await recv.receive())
                    except anyio.EndOfStream:
                        return
                while len(batch) < _BATCH:
                    try:
                        batch.append(recv.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await anyio.to_thread.run_sync(self._write_batch, batch)
                if time.monotonic() - last_commit >= self.opts.commit_interval_s:
                    last_commit = time.monotonic()
                    await anyio.to_thread.run_sync(self.store.commit, self.progress_dict())
                if self.fatal is not None:
                    raise self.fatal

    def _write_batch(self, batch: list[Item]) -> None:
        samples = [x for x in batch if isinstance(x, Sample)]
        failures = [x for x in batch if isinstance(x, Failure)]
        rejects = [x for x in batch if isinstance(x, Reject)]
        if samples:
            self.store.write_samples(samples)
        if failures:
            self.store.write_failures(failures)
        if rejects:
            self.store.write_rejects(rejects)


    # ------------------------------------------------------------ side tasks
    async def poll_load(self, http: httpx.AsyncClient) -> None:
        """Feed the controller with the server's live load every poll_interval_s."""
        assert self.handle is not None and self.controller is not None
        capacity = self.handle.capacity
        while True:
            await anyio.sleep(self.opts.poll_interval_s)
            if self.handle.capacity is not capacity:  # re-read after a server restart
                capacity = self.handle.capacity
                self.controller.update_capacity(capacity)
            snap = await read_load(http, self.handle.base_urls, time.monotonic())
            if snap is not None:
                self.last_load = snap
                self.controller.observe_load(snap)
            self.retune()

    async def report_progress(self, progress: Progress) -> None:
        while True:
            figures = self.figures()
            progress.update(figures)
            if self.opts.on_figures is not None:
                self.opts.on_figures(figures)
            await anyio.sleep(0.5)

    async def handle_signals(self) -> None:
        """First SIGINT/SIGTERM drains (stop dispatching, wait drain_grace_s), the second cancels."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self._draining:
                    self.on_event(f"{name} again: cancelling {self.in_flight} in-flight requests.")
                    self._requests_scope.cancel()
                    return
                self._draining = True
                self.stopped_by = name
                self.on_event(f"{name}: no new requests; waiting up to {self.opts.drain_grace_s:.0f} s for "
                              f"{self.in_flight} in flight (again to stop now).")
                self._producer_scope.cancel()
                self._requests_scope.deadline = anyio.current_time() + self.opts.drain_grace_s

    # ------------------------------------------------------------ main
    async def main(self, http: httpx.AsyncClient) -> None:
        source = iter_prompts(self.cfg, self.skip_ids, self.stats, self._rejects_buffer,
                              owns=self.opts.rank.owns if self.opts.rank.ranked else None)
        first = await anyio.to_thread.run_sync(lambda: list(islice(source, _BATCH)))
        progress = Progress(self.cfg.name, self.store.done, self.store.target, mode=self.opts.progress)
        try:
            async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
                self.handle = await self._start_server(tg, http)
                self.controller = Controller(self.handle.capacity, config=self.opts.controller,
                                             initial_tokens_per_request=self._initial_tokens(first))
                g = self.cfg.generation
                transport = await stack.enter_async_context(AiohttpTransport(
                    max_connections=self._max_connections(), connect_timeout_s=g.connect_timeout_s,
                    request_timeout_s=g.request_timeout_s))
                client = ChatClient(transport, self.handle.base_urls, self._client_settings(),
                                    gate=self.handle.wait_ready, on_request_done=self.on_request_done)
                self.retune()
                tg.start_soon(self.poll_load, http)
                if progress.mode != "quiet" or self.opts.on_figures is not None:
                    tg.start_soon(self.report_progress, progress)
                tg.start_soon(self.handle_signals)
                await self._work(client, first, source)
                tg.cancel_scope.cancel()  # stops the server, the poller and the reporter
        finally:
            progress.update(self.figures())
            progress.close()

    async def _work(self, client: ChatClient, first: list[Prompt], source: Any) -> None:
        """Producer and requests in an inner group (a drain deadline cancels only them); the writer
        outside it, so every finished sample is written before the run ends."""
        send, recv = anyio.create_memory_object_stream[Item](_BATCH * 4)
        async with anyio.create_task_group() as work:
            work.start_soon(self.write, recv)
            async with anyio.create_task_group() as requests:
                self._requests_scope = requests.cancel_scope
                with self._producer_scope:
                    await self.produce(requests, client, send, first, source)
        if self.stopped_by == "target" and self.store.remaining > 0:
            self.stopped_by = "limit"

    async def _start_server(self, tg: TaskGroup, http: httpx.AsyncClient) -> ServerHandle:
        log_dir = self.store.folder
        if self.opts.server_urls:
            return await tg.start(_attached, list(self.opts.server_urls), http, self.on_event)
        assert self.opts.profile is not None
        return await tg.start(_launched, self.opts.profile, log_dir, http, self.on_event)

    def _max_connections(self) -> int:
        """One connection per request in flight: the window's ceiling (fixed, or the server's slots + slack)."""
        if self.opts.window:
            return self.opts.window
        assert self.handle is not None
        return max(64, min(4096, 2 * (self.handle.capacity.max_running_requests or 1024)))

    def _initial_tokens(self, first: list[Prompt]) -> float:
        """Tokens a request holds at its end, before any completion: errs low (half the output cap)."""
        max_new = self.cfg.sampling.max_new_tokens
        return max(64.0, estimate_prompt_tokens(first) + 0.5 * min(max_new, 4096))

    def _client_settings(self) -> ClientSettings:
        assert self.handle is not None
        info = self.handle.info
        # a launched server's backend is what its profile says (the simulator's says "sim")
        backend = self.opts.profile.backend if self.opts.profile else str(info.get("backend", "openai"))
        return ClientSettings(model=self.handle.model or self.opts.model, backend=backend,
                              sampling=self.cfg.sampling, generation=self.cfg.generation,
                              kv_cache_dtype=str(info.get("kv_cache_dtype") or "unknown"))

    def summary(self) -> RunSummary:
        return RunSummary(self.cfg.name, self.store.done, self.store.target, written=self.ok,
                          failures=self.failures, rejects=self.rejects, elapsed_s=time.monotonic() - self.started,
                          stopped_by=self.stopped_by, failure_reasons=dict(self.failure_reasons),
                          final_failures=self.final_failures)


async def _attached(urls: list[str], http: httpx.AsyncClient, on_event: Any, *, task_status: Any) -> None:
    await run_attached(urls, http=http, on_event=on_event, task_status=task_status)


async def _launched(profile: ServerProfile, log_dir: Path, http: httpx.AsyncClient, on_event: Any, *,
                    task_status: Any) -> None:
    await run_server(profile, log_dir=log_dir, http=http, on_event=on_event, task_status=task_status)


async def identify_model(http: httpx.AsyncClient, urls: tuple[str, ...]) -> str:
    """The first model id `GET /v1/models` lists on the first server; raises ServerError."""
    url = urls[0].rstrip("/") + "/v1/models"
    try:
        r = await http.get(url, timeout=10.0)
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ServerError(f"{url} did not list a model ({type(e).__name__}: {e}). Is SERVER_URL an SGLang or "
                          "OpenAI-compatible server? Check the address and that the server is up.") from None


async def run_generate(cfg: DatasetConfig, opts: RunOptions, *, on_event: Any = print) -> RunSummary:
    """Generate `cfg` up to its target (or --limit); resumable. Raises GenPipelineError subclasses."""
    async with make_http_client(cfg.generation, 16) as http:  # control traffic: health, loads, model
        model = opts.model
        if not model:
            if opts.server_urls:
                model = await identify_model(http, opts.server_urls)
            else:
                assert opts.profile is not None, "RunOptions needs server_urls or a profile"
                model = opts.profile.request_model
        store = DatasetStore(opts.output_root, cfg.name, fingerprint=cfg.fingerprint(model),
                             target=cfg.target_samples, shard_max_samples=cfg.output.shard_max_samples,
                             fsync_every=cfg.output.fsync_every,
                             file_opener=opts.file_opener or default_opener, rank=opts.rank)
        state = await anyio.to_thread.run_sync(store.open)
        for note in state.notes:
            on_event(note)
        run = _Run(cfg, opts, store, set(state.done_ids) | store.final_failure_ids(), on_event)
        try:
            if run.goal <= 0:
                run.stopped_by = "nothing_to_do"
                run.keep_last_figures = True  # status keeps showing the last real run's throughput
                store.record_stop(run.stopped_by)
                return run.summary()
            try:
                await run.main(http)
            except BaseExceptionGroup as group:
                raise _first_known(group) from None
            store.record_stop(run.stopped_by)  # status says "source exhausted" from this
            return run.summary()
        finally:
            with anyio.CancelScope(shield=True):  # the manifest must be committed even when cancelled
                await anyio.to_thread.run_sync(store.close, None if run.keep_last_figures else run.progress_dict())


def _first_known(group: BaseExceptionGroup) -> BaseException:
    """Task groups wrap errors in groups: surface our own error (the CLI has a message for it)."""
    matched, _ = group.split(GenPipelineError)
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]
    return matched if matched is not None else group
