"""The I/O around a Fleet: health checks, probes back in, liveness probes (hang.py), routers' `/workers`, capacity
re-summed, the load poll. Each check runs in its own task, so a server that does not answer delays no other's."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from gen_pipeline.errors import ServerError
from gen_pipeline.http import Http, HttpError, NoAnswer
from gen_pipeline.records import Capacity, LoadSnapshot
from gen_pipeline.server.capacity import combine, get_or_none, probe
from gen_pipeline.server.handle import ServerHandle
from gen_pipeline.server.hang import ALIVE_PATH, HANG_AFTER_S, HangWatch
from gen_pipeline.server.health import check_timeout_s, why_unhealthy
from gen_pipeline.server.load import merge, read_load

log = logging.getLogger(__name__)
TICK_S = 0.25  # capacity follows a server the client took out within this
ROUTERS_EVERY_S = 1.0  # a router's /workers is cheap: a worker added or lost is seen within a second


class FleetWatch:
    """Keeps `handle` (capacity, worker_urls, readiness) in step with the fleet; `run` until cancelled."""

    def __init__(self, http: Http, handle: ServerHandle, *, interval_s: float,
                 give_up_after_s: float, hang_after_s: float = HANG_AFTER_S):
        assert handle.fleet is not None
        self.http, self.handle, self.fleet = http, handle, handle.fleet
        self.interval_s, self.give_up_after_s = interval_s, give_up_after_s
        self.hangs = HangWatch(hang_after_s)  # no progress this long with requests in flight: hung? (hang.py)
        self._busy: set[tuple[str, str]] = set()  # (what, url) of the checks and probes under way
        self._cancelled_down: set[str] = set()  # down servers whose stalled requests were cancelled (this time)
        self.down_since_s: float | None = None  # no server has answered since then
        self.workers: dict[str, list[str]] = {}  # base URL → the servers it stands for ([itself] unless a router)
        self.caps: dict[str, Capacity | None] = {}  # per server (None: it does not say)
        # what a server back from an outage must serve, and how to ask it (attach.identify); unchecked: None
        self.served: tuple[str, Callable[[str], Awaitable[str]]] | None = None

    async def refresh(self, url: str) -> None:
        """(Re-)read which servers `url` stands for and their capacity and info."""
        self.workers[url] = await worker_urls(self.http, url)
        for worker in self.workers[url]:
            await self._probe(worker)

    async def _probe(self, worker: str) -> None:
        cap, info = await probe(self.http, worker)
        self.caps[worker] = cap
        if info and not self.handle.info:
            self.handle.info = info
            self.handle.metrics = bool(info.get("enable_metrics"))

    def resum(self) -> None:
        """Capacity and worker_urls over the servers that are up now (a new Capacity object when it changed)."""
        up = self.handle.worker_urls = self._workers_up()
        for url in self.fleet.urls:
            cap = self.caps.get(url) if self.workers.get(url) == [url] else None  # a router's is its workers'
            self.fleet.set_capacity(url, cap.max_total_num_tokens if cap is not None else None)
        capacity = combine([self.caps[w] for w in up if w in self.caps])
        if up and capacity != self.handle.capacity:  # none up: dispatch is paused, the last figure stands
            self.handle.capacity = capacity

    async def run(self) -> None:
        """Every TICK_S: hangs, routers' workers (each ROUTERS_EVERY_S), readiness and capacity follow the fleet;
        every interval_s: health checks and due probes back in. Raises ServerError once no server has answered
        for give_up_after_s."""
        resummed = self.fleet.version
        next_routers_s = next_health_s = time.monotonic()
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(min(self.interval_s, TICK_S))
                now_s = time.monotonic()
                self._watch_hangs(tg, now_s)
                if now_s >= next_routers_s:
                    next_routers_s = now_s + ROUTERS_EVERY_S
                    await self._reread_routers()
                if now_s >= next_health_s:
                    next_health_s = now_s + self.interval_s
                    for url in self.fleet.up_urls:
                        self._spawn(tg, "health", url, self._check_one)
                    # all down (dispatch paused): probe every interval, there is nothing to spare them for
                    due = self.fleet.due_probes(now_s) if self.fleet.up_urls else self.fleet.down_urls
                    for url in due:
                        self._spawn(tg, "back", url, self._probe_one)
                self._readiness(time.monotonic())
                if self.fleet.version != resummed or self._workers_up() != self.handle.worker_urls:
                    resummed = self.fleet.version
                    self.resum()

    def _spawn(self, tg: TaskGroup, what: str, url: str, check: Callable[[str], Awaitable[None]]) -> None:
        """`check(url)` in its own task, unless the same one is still under way."""
        key = (what, url)
        if key in self._busy:
            return
        self._busy.add(key)

        async def one() -> None:
            try:
                await check(url)
            finally:
                self._busy.discard(key)
        tg.start_soon(one)

    def _watch_hangs(self, tg: TaskGroup, now_s: float) -> None:
        """Take out an up server that is stopped or frozen (hang.py); probe the silent ones. A server out
        already (taken out by failed checks or connection errors, its requests left to end by themselves)
        whose requests make no progress for hang_after_s: those are cancelled and re-sent, once."""
        for url in self.fleet.down_urls:
            stuck, silent_s = self.fleet.in_flight(url), self.fleet.silent_s(url, now_s)
            if stuck and silent_s >= self.hangs.hang_after_s and url not in self._cancelled_down:
                self._cancelled_down.add(url)
                self.fleet.cancel_sent(url)
                log.warning("%s is out and its %d in-flight requests made no progress for %.1f s: re-sent%s", url,
                            stuck, silent_s, " to the others" if self.fleet.up_urls else " once a server answers")
        self._cancelled_down &= set(self.fleet.down_urls)
        for url in self.fleet.up_urls:
            stuck, silent_s = self.fleet.in_flight(url), self.fleet.silent_s(url, now_s)
            why = self.hangs.frozen(url, now_s, silent_s, stuck)
            if why is not None:
                self._take_out_hung(url, now_s, silent_s, stuck, f"{why}: stopped or frozen?")
            elif self.hangs.due(url, now_s, silent_s, stuck):
                self.hangs.sent(url, now_s)
                tg.start_soon(self._alive, url, now_s)

    async def _alive(self, url: str, sent_s: float) -> None:
        """GET /v1/models: does the process answer at all (any status)? (hang.py)"""
        timeout_s = self.hangs.probe_timeout_s
        try:
            await self.http.get(url + ALIVE_PATH, timeout_s=timeout_s)
        except HttpError as e:
            why = (f"no answer to GET {ALIVE_PATH} within {timeout_s:g} s" if isinstance(e, NoAnswer)
                   else f"GET {ALIVE_PATH} failed ({e.why})")
            self.hangs.unanswered(url, sent_s, why)
            if self.fleet.is_up(url):  # taken out meanwhile: keep the reason it was taken out for
                self.fleet.why[url] = why
        else:
            self.hangs.answered(url)

    def _take_out_hung(self, url: str, now_s: float, silent_s: float, stuck: int, why: str) -> None:
        """Out, its requests in flight cancelled and re-sent (Fleet.mark_down(cancel=True))."""
        why = f"no progress for {silent_s:.1f} s on {stuck} in-flight requests and {why}"
        self.fleet.mark_down(url, now_s, cancel=True)
        self._cancelled_down.add(url)
        self.hangs.forget(url)
        where = "re-sent to the others" if self.fleet.up_urls else "will be re-sent once a server answers"
        self.report_taken_out(url, f"{why} {stuck} in-flight requests {where}")

    def _readiness(self, now_s: float) -> None:
        handle = self.handle
        refusal = self.fleet.refusal(handle.model)
        if refusal is not None:  # every server serves another model now: none will come back
            handle.mark_failed(ServerError(refusal))
            raise ServerError(refusal)
        if self.fleet.up_urls:
            if self.down_since_s is not None:
                log.info("server is back after %.0f s: %s", now_s - self.down_since_s, handle.summary_line())
            self.down_since_s = handle.down_since_s = None
            handle.mark_ready()  # idempotent: wakes only waiters of a handle that was down
            return
        if self.down_since_s is None:
            self.down_since_s = handle.down_since_s = now_s
            handle.mark_down()
            log.warning("no server answers (%s); dispatch paused, waiting up to %g s for one to come back "
                        "(--server-wait-s)", self._whys(), self.give_up_after_s)
        if now_s - self.down_since_s >= self.give_up_after_s:
            error = ServerError(f"No server answered for {self.give_up_after_s:g} s ({self._whys()}); giving up. "
                                "Nothing written is lost: run the same command once the server is back "
                                "(--server-wait-s sets how long a run waits).")
            handle.mark_failed(error)
            raise error

    def _whys(self) -> str:
        return ", ".join(f"{u}: {self.fleet.why.get(u, 'taken out')}" for u in self.fleet.urls)

    def _workers_up(self) -> list[str]:
        return [w for u in self.fleet.up_urls for w in self.workers.get(u, [])]

    async def health(self, url: str) -> str | None:
        """None when GET /health answered 200 within the check timeout (progress), else why not (remembered)."""
        why = await why_unhealthy(self.http, url, check_timeout_s(self.interval_s))
        if why is not None:
            self.fleet.why[url] = why
        elif url in self.fleet.urls:
            self.fleet.answered(url, time.monotonic())
        return why

    async def _check_one(self, url: str) -> None:
        """One /health check of an up server: a failure with requests in flight and no progress for
        hang_after_s is a stuck scheduler (hang.py); other failures count toward fail_after."""
        why = await self.health(url)
        if not self.fleet.is_up(url):  # taken out meanwhile
            return
        if why is None:
            self.fleet.succeeded(url)  # health() has noted the 200 as progress
            return
        now_s = time.monotonic()
        silent_s, stuck = self.fleet.silent_s(url, now_s), self.fleet.in_flight(url)
        if stuck and silent_s >= self.hangs.hang_after_s:  # "/health answered HTTP 503", "/health failed (...)"
            said = why.removeprefix("/health ") if why.startswith("/health ") else f"failed ({why})"
            self._take_out_hung(url, now_s, silent_s, stuck, f"/health {said}: scheduler stuck?")
        elif self.fleet.failed(url, now_s, health=True):
            self.report_taken_out(url, f"{self.fleet.fail_after} failed health checks in a row ({why})")

    def report_taken_out(self, url: str, why: str) -> None:
        log.warning("took %s out after %s; %d of %d servers left, probing it back with backoff",
                    url, why, len(self.fleet.up_urls), len(self.fleet.urls))

    async def _probe_one(self, url: str) -> None:
        """A down server's /health: back in when it answers 200 (capacity read again) and serves the model it
        served at start (else out for good), else a longer backoff."""
        if await self.health(url) is not None:
            self.fleet.probe_failed(url, time.monotonic())
            return
        try:
            served = await self.served[1](url) if self.served is not None else ""
            await self.refresh(url)  # it may have come back with another capacity
        except ServerError:
            self.fleet.probe_failed(url, time.monotonic())
            return
        if self.served is not None and served != self.served[0]:  # restarted with another model
            line = self.fleet.refuse(url, served, self.handle.model, time.monotonic())
            if line is not None:
                log.warning("%s", line)
            return
        self.fleet.mark_up(url)
        self.fleet.answered(url, time.monotonic())
        log.info("%s is back in; %d of %d servers up", url, len(self.fleet.up_urls), len(self.fleet.urls))

    async def _reread_routers(self) -> None:
        for url in self.fleet.up_urls:
            known = self.workers.get(url, [url])
            if known == [url]:
                continue  # a plain server
            now = await worker_urls(self.http, url)
            if now == [url] or set(now) == set(known):
                continue  # an unanswered /workers keeps the last list
            added, gone = sorted(set(now) - set(known)), sorted(set(known) - set(now))
            for worker in added:
                await self._probe(worker)
            self.workers[url] = now
            log.info("router %s workers changed (%s); %d workers", url,
                     ", ".join([f"+{w}" for w in added] + [f"-{w}" for w in gone]), len(now))


async def read_fleet_load(http: Http, handle: ServerHandle, now_s: float) -> LoadSnapshot | None:
    """Load summed over the servers that answer (a router's workers, not the router); the fleet learns
    each server's KV in use. None when none answers."""
    snaps = {url: await read_load(http, [url], now_s) for url in handle.load_urls}
    if handle.fleet is not None:
        handle.fleet.update({u: s for u, s in snaps.items() if u in handle.fleet.urls}, now_s)
    found = [s for s in snaps.values() if s is not None]
    return merge(found) if found else None


async def worker_urls(http: Http, url: str) -> list[str]:
    """The servers behind an sglang-router at `url`, or [url] when it is a server itself."""
    for path in ("/workers", "/list_workers"):
        body = await get_or_none(http, url + path)
        found = _urls_in(body)
        if found:
            return found
    return [url]


def _urls_in(body: Any) -> list[str]:
    items = body.get("workers", body.get("urls")) if isinstance(body, dict) else body
    if not isinstance(items, list):
        return []
    urls = []
    for it in items:
        if isinstance(it, dict):  # sglang-router keeps a dead worker listed, is_healthy false: no capacity
            it = it.get("url") if it.get("is_healthy") is not False else None
        if isinstance(it, str) and it.startswith("http"):
            urls.append(it.rstrip("/"))
    return urls
