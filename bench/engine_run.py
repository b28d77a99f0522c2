"""The production dispatcher (gen_pipeline.run.dispatch: Dispatcher, Window, the Controller, RunStats)
driving the simulator's Engine in simulated time, in process.

The transport is a coroutine that adds the request to the engine and waits for its finish; a driver
task steps the engine. Before each step the driver lets every other task run until all are blocked
(the dispatcher has refilled the window: a client with no network delay), so the run is
deterministic. The clock of the window, the controller and the statistics is the engine's
simulated time; every simulated second the window gets a LoadSnapshot (`observe_load`, as the
pipeline's poller calls it) and the client's per-request hook reports each completion
(`Window.observe_completion`), both exactly as in a run.
"""

from __future__ import annotations

import asyncio
import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from bench.jobs import POLL_S, Job, RunResult, ServerConfig, result_of, send_request, snapshot, trace_point
from gen_pipeline.controller import Controller, ControllerConfig
from gen_pipeline.records import Capacity, Prompt, Reject, Sample
from gen_pipeline.run.dispatch import Dispatcher, Item, Window
from gen_pipeline.run.stats import RunStats

_MESSAGES = ({"role": "user", "content": "x"},)


class _JobFeed:
    """The job's samples as prompts whose id is their index, in one batch."""

    def __init__(self, total: int) -> None:
        self._batch: list[Prompt] | None = [Prompt(str(i), _MESSAGES) for i in range(total)]

    async def next_batch(self) -> list[Prompt]:
        batch, self._batch = self._batch or [], None
        return batch

    def take_rejects(self) -> list[Reject]:
        return []


async def _all_blocked() -> None:
    """Return once every other task waits on something (asyncio: a pending future)."""
    this = asyncio.current_task()
    while True:
        await anyio.lowlevel.checkpoint()
        if all(t is this or (t._fut_waiter is not None and not t._fut_waiter.done())  # type: ignore[attr-defined]
               for t in asyncio.all_tasks()):
            return


class _EngineRun:
    def __init__(self, job: Job, server: ServerConfig, fixed: int | None,
                 config: ControllerConfig = ControllerConfig(), trace_phase_s: float | None = None) -> None:
        self.job, self.engine = job, server.engine()
        self.trace_phase_s = trace_phase_s
        clock = self._now
        self.window = Window(fixed=fixed, clock=clock)
        if fixed is None:
            capacity = Capacity(self.engine.config.max_total_num_tokens, self.engine.max_running_requests,
                                source="sim", cuda_graph_max_bs=self.engine.config.cuda_graph_max_bs)
            self.window.controller = Controller(capacity, initial_tokens_per_request=job.initial_tokens_per_request(),
                                                config=config)
        self.dispatcher = Dispatcher(len(job.lengths), self.window, RunStats(clock))
        self._waiting: dict[str, tuple[anyio.Event, list]] = {}
        self.tokens = self.peak_queued = 0
        self.running: list[int] = []
        self.windows: list[int] = []
        self.trace: list[dict] = []  # per poll: what the server showed (bench/sim_vs_real.py compares it)

    def _now(self) -> float:
        return self.engine.now_s

    async def regenerate(self, prompt: Prompt) -> Sample:
        """The transport: one request into the engine, back when it finished."""
        done, box = anyio.Event(), []
        self._waiting[f"r{prompt.id}"] = (done, box)
        send_request(self.engine, self.job, int(prompt.id))
        await done.wait()
        f = box[0]
        if f.finish_reason == "abort":
            raise RuntimeError(f"request {f.rid} aborted by the engine")
        self.window.observe_completion(f.prompt_tokens, f.completion_tokens, f.e2e_latency_s)
        self.tokens += f.completion_tokens
        return Sample(prompt.id, "bench", [], {"completion_tokens": f.completion_tokens})

    async def drive(self) -> None:
        engine, next_poll_s, changed = self.engine, POLL_S, True
        next_trace_s = self.trace_phase_s  # None: the trace rows are the controller's polls
        while True:
            if changed:
                await _all_blocked()
            result = engine.step()
            if result.dt_s == 0 and not result.finished:
                if self.dispatcher.in_flight == 0:
                    await anyio.sleep_forever()  # the job is done: the run cancels this task
                raise RuntimeError(f"engine idle with {self.dispatcher.in_flight} in flight")
            self.peak_queued = max(self.peak_queued, engine.num_waiting)
            for f in result.finished:
                done, box = self._waiting.pop(f.rid)
                box.append(f)
                done.set()
            changed = bool(result.finished)
            while engine.now_s >= next_poll_s:
                snap = snapshot(engine)
                self.running.append(snap.running)
                self.window.observe_load(snap)  # as the job's poller does (run/job.py _poll_load)
                self.dispatcher.retune()
                if self.window.controller is not None:
                    self.windows.append(self.window.controller.statistics().window)
                if next_trace_s is None:
                    self.trace.append(trace_point(engine, snap, self.window.size))
                next_poll_s += POLL_S
                changed = True
            while next_trace_s is not None and engine.now_s >= next_trace_s:
                # the poll's own time; the state after the iteration (~ms) that spanned it
                row = trace_point(engine, snapshot(engine), self.window.size)
                self.trace.append({**row, "t_s": round(next_trace_s, 3)})
                next_trace_s += POLL_S

    async def main(self) -> None:
        send, recv = anyio.create_memory_object_stream[Item](math.inf)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, recv)
            tg.start_soon(self.drive)
            async with anyio.create_task_group() as requests:
                await self.dispatcher.produce(requests, self.regenerate, send, _JobFeed(len(self.job.lengths)))
            tg.cancel_scope.cancel()


async def _drain(recv: MemoryObjectReceiveStream[Item]) -> None:
    async with recv:
        async for _ in recv:
            pass


def run(job: Job, server: ServerConfig, fixed: int | None = None, name: str = "",
        config: ControllerConfig = ControllerConfig()) -> tuple[RunResult, list[int]]:
    """The whole job through the production dispatcher with a fixed window or (None) the controller;
    returns the figures and the controller's window at each poll."""
    r = _EngineRun(job, server, fixed, config)
    anyio.run(r.main)
    total = len(job.lengths)
    label = name or ("ours" if fixed is None else f"fixed {fixed}")
    return result_of(label, r.engine, total, r.dispatcher.ok, r.tokens, r.peak_queued, r.running), r.windows


def run_traced(job: Job, server: ServerConfig, fixed: int | None = None,
               config: ControllerConfig = ControllerConfig(),
               trace_phase_s: float | None = None) -> tuple[RunResult, list[dict]]:
    """run(), returning the server's per-second trace (bench/gpu/traces.py rows) instead of the windows.

    The trace rows are the controller's polls (every POLL_S from POLL_S on), or with `trace_phase_s` a
    poller of their own at trace_phase_s, + POLL_S, ... (the controller keeps its polls): the GPU check's
    TracePoller polls at its own offset from the client's start, and a ramp read from once-a-second rows
    is only comparable at the same offsets."""
    r = _EngineRun(job, server, fixed, config, trace_phase_s)
    anyio.run(r.main)
    label = "ours" if fixed is None else f"fixed {fixed}"
    return (result_of(label, r.engine, len(job.lengths), r.dispatcher.ok, r.tokens, r.peak_queued, r.running),
            r.trace)
