"""Dispatch: the concurrency window (shared by a job's datasets) and one dataset's exactly-target accounting:
a prompt is sent only while `ok + in_flight < goal`, and a failure frees its place for another prompt."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from gen_pipeline.controller import Controller, ControllerStats
from gen_pipeline.records import Failure, LoadSnapshot, Prompt, Reject, Sample
from gen_pipeline.run.stats import RunStats

Item = Sample | Failure | Reject
Regenerate = Callable[[Prompt], Awaitable[Sample | Failure]]


class PromptFeed(Protocol):
    """Where prompts come from: batches (empty when the source is exhausted) and the rows it rejected."""

    async def next_batch(self) -> list[Prompt]: ...
    def take_rejects(self) -> list[Reject]: ...


class Window:
    """Requests allowed in flight: `limiter.total_tokens`, retuned after every completion and load poll."""

    def __init__(self, *, fixed: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed, self.clock = fixed, clock
        self.controller: Controller | None = None
        self.limiter = anyio.CapacityLimiter(1)
        self.members: list[Dispatcher] = []  # a job's datasets, in dispatch order (empty: one dataset)

    @property
    def size(self) -> int:
        return int(self.limiter.total_tokens)

    def retune(self, need: int) -> None:
        """Size the window for `need` samples still to produce (a job's: its members' needs)."""
        need = max(self._job_need() if self.members else need, 1)
        if self.fixed:
            window = self.fixed
        else:
            assert self.controller is not None, "Window needs a controller or a fixed size"
            window = self.controller.window(self.clock(), need)
        self.limiter.total_tokens = max(1, min(window, need))

    def _job_need(self) -> int:
        """What the job's live datasets still need; tells the controller the mix in flight."""
        live = [d for d in self.members if not d.exhausted and not d.draining]
        if self.controller is not None:
            mix = {d.name: float(d.in_flight) for d in self.members}
            if not any(mix.values()) and (first := next((d for d in live if d.need() > 0), None)) is not None:
                mix[first.name] = 1.0
            self.controller.set_mix(mix)
        return sum(max(0, d.need()) for d in live)

    def observe_completion(self, prompt_tokens: int, completion_tokens: int, latency_s: float,
                           kind: str | None = None) -> None:
        """The client's per-request hook (usage token counts, latency in seconds; a job's dataset)."""
        if self.controller is not None:
            self.controller.observe_completion(self.clock(), prompt_tokens, completion_tokens, latency_s, kind)

    def observe_load(self, snap: LoadSnapshot) -> None:
        if self.controller is not None:  # with the requests out now: those the server has not seen yet
            self.controller.observe_load(snap, in_flight=int(self.limiter.borrowed_tokens))

    def controller_stats(self) -> ControllerStats | None:
        return self.controller.statistics() if self.controller is not None else None


class Dispatcher:
    """Exactly-target dispatch of one dataset's prompts through a Window."""

    def __init__(self, goal: int, window: Window, stats: RunStats, name: str = "") -> None:
        self.goal, self.window, self.stats, self.name = goal, window, stats, name
        self.all_sent = anyio.Event()  # set once every prompt it needs is sent (a job starts the next dataset)
        self.ok = 0  # samples produced this run (written or about to be)
        self.in_flight = 0
        self.exhausted = False  # the source ran out before the goal
        self.draining = False  # a signal asked to stop: no new requests
        self._changed = anyio.Event()

    def need(self) -> int:
        return self.goal - self.ok

    def retune(self) -> None:
        self.window.retune(self.need())

    async def produce(self, tg: TaskGroup, regenerate: Regenerate, send: MemoryObjectSendStream[Item],
                      feed: PromptFeed) -> None:
        """Send prompts until the goal is met (nothing in flight), the source ends or draining starts."""
        limiter = self.window.limiter
        self.retune()
        pending: list[Prompt] = []
        try:
            async with send:
                await self._send_rejects(send, feed)
                while not self.draining:
                    token = object()
                    await limiter.acquire_on_behalf_of(token)
                    if self.ok + self.in_flight >= self.goal:
                        limiter.release_on_behalf_of(token)
                        self.all_sent.set()
                        if self.in_flight == 0:
                            return
                        await self._changed.wait()
                        continue
                    if not pending:
                        pending = (await feed.next_batch())[::-1]  # popped from the end, in source order
                        await self._send_rejects(send, feed)
                    if not pending:
                        limiter.release_on_behalf_of(token)
                        self.exhausted = True
                        self.all_sent.set()
                        return
                    self.in_flight += 1
                    tg.start_soon(self._request, regenerate, pending.pop(), token, send.clone())
        finally:
            self.all_sent.set()  # also when it stopped early (exhausted, draining): the next one may start

    async def _send_rejects(self, send: MemoryObjectSendStream[Item], feed: PromptFeed) -> None:
        rejects = feed.take_rejects()
        self.stats.rejects += len(rejects)
        for reject in rejects:
            await send.send(reject)

    async def _request(self, regenerate: Regenerate, prompt: Prompt, token: object,
                       send: MemoryObjectSendStream[Item]) -> None:
        async with send:
            try:
                result = await regenerate(prompt)
            finally:
                self.in_flight -= 1
                self.window.limiter.release_on_behalf_of(token)
            if isinstance(result, Sample):
                self.ok += 1
                self.stats.count_sample(result.meta["completion_tokens"])
            else:
                self.stats.count_failure(result, ok_so_far=self.ok)
            self.retune()
            changed, self._changed = self._changed, anyio.Event()
            changed.set()
            await send.send(result)


Launch = Callable[[Dispatcher], tuple[Regenerate, MemoryObjectSendStream[Item], PromptFeed]]


async def produce_in_order(requests: TaskGroup, dispatchers: list[Dispatcher], launch: Launch) -> None:
    """Each dispatcher's producer starts the moment the previous one has sent every prompt it needs."""
    async with anyio.create_task_group() as producers:
        for d in dispatchers:
            regenerate, send, feed = launch(d)
            producers.start_soon(d.produce, requests, regenerate, send, feed)
            await d.all_sent.wait()
