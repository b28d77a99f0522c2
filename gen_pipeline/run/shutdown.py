"""Signals: the first SIGINT/SIGTERM drains (no new requests, in-flight ones get drain_grace_s), the
second cancels the requests at once. The scopes are entered by pipeline.py around the producer and
the requests' task group."""

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

    async def handle_signals(self, in_flight: Callable[[], int], on_drain: Callable[[], None]) -> None:
        """Until cancelled: first signal → `on_drain()` and a drain deadline; second → cancel requests."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.signal is not None:
                    log.warning("%s again: cancelling %d in-flight requests.", name, in_flight())
                    self.requests_scope.cancel()
                    return
                self.signal = name
                on_drain()
                log.warning("%s: no new requests; waiting up to %.0f s for %d in flight (again to stop now).",
                            name, self.drain_grace_s, in_flight())
                self.producer_scope.cancel()
                self.requests_scope.deadline = anyio.current_time() + self.drain_grace_s
