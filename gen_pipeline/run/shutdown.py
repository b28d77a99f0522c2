"""Signals, for the whole of a job's run (job.py `Job.run`): before the server answers (launch mode:
SGLang loading), the first SIGINT/SIGTERM stops the start-up (the server's process group is stopped on
the way out); once requests go, the first drains (no new requests, in-flight ones get drain_grace_s)
and the second cancels the requests at once. Any later one (the server being stopped, the stores being
committed) is noted and ignored: the run always ends with its summary, 130/143 and its locks released.
The scopes are entered by job.py around the producer and the requests' task group."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import anyio

log = logging.getLogger(__name__)


class Shutdown:
    def __init__(self, drain_grace_s: float) -> None:
        self.drain_grace_s = drain_grace_s
        self.signal: str | None = None  # "SIGINT" | "SIGTERM" once one arrived
        self.producer_scope = anyio.CancelScope()
        self.requests_scope = anyio.CancelScope()  # replaced by the requests task group's scope
        self.startup_scope: anyio.CancelScope | None = None  # the job's, until the server answers
        self.serving = False  # the server answered: a signal drains instead of stopping the start-up
        self._count = 0

    async def handle_signals(self, in_flight: Callable[[], int], on_drain: Callable[[], None]) -> None:
        """Until cancelled: first signal → stop the start-up, or `on_drain()` and a drain deadline;
        second → cancel requests; later ones are only logged."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.on_signal(signal.Signals(signum).name, in_flight, on_drain)

    def on_signal(self, name: str, in_flight: Callable[[], int], on_drain: Callable[[], None]) -> None:
        self._count += 1
        if self._count > 2 or (self._count == 2 and not self.serving):
            log.warning("%s again: already stopping (the server and the stores are being closed).", name)
            return
        if self._count == 2:
            log.warning("%s again: cancelling %d in-flight requests.", name, in_flight())
            self.requests_scope.cancel()
            return
        self.signal = name
        if self.startup_scope is None:  # the set-up (stores, sources) is not interrupted: it ends first
            log.warning("%s during set-up: stopping once it ends, before any server starts.", name)
            return
        if not self.serving:
            log.warning("%s during server start-up: stopping the server; run the same command to resume.", name)
            self.startup_scope.cancel()
            return
        on_drain()
        log.warning("%s: no new requests; waiting up to %.0f s for %d in flight (again to stop now).",
                    name, self.drain_grace_s, in_flight())
        self.producer_scope.cancel()
        self.requests_scope.deadline = anyio.current_time() + self.drain_grace_s
