"""Signals during a job: the first stops the set-up or the server's start-up, or drains (in-flight requests get
drain_grace_s); the second cancels the requests; later ones are ignored, so the run always ends with its summary."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

import anyio

from gen_pipeline.signals import SIGNALS, hold_signals, holding, install_hold, take_held

__all__ = ["SIGNALS", "Shutdown", "hold_signals"]

log = logging.getLogger(__name__)


class Shutdown:
    def __init__(self, drain_grace_s: float) -> None:
        self.drain_grace_s = drain_grace_s
        self.signal: str | None = None  # "SIGINT" | "SIGTERM" | "SIGHUP" once one arrived
        self.setup_scope = anyio.CancelScope()  # the set-up's (setup.py open_datasets)
        self.producer_scope = anyio.CancelScope()
        self.requests_scope = anyio.CancelScope()  # replaced by the requests task group's scope
        self.startup_scope: anyio.CancelScope | None = None  # the job's, until the server answers
        self.serving = False  # the server answered: a signal drains instead of stopping the start-up
        self._count = 0

    async def handle_signals(self, in_flight: Callable[[], int], on_drain: Callable[[], None], *,
                             task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: the signals as the module doc says, those held before (hold_signals) first."""
        try:
            with anyio.open_signal_receiver(*SIGNALS) as signals:
                while (held := take_held()) is not None:
                    self.on_signal(held, in_flight, on_drain)
                task_status.started()
                async for signum in signals:
                    self.on_signal(signal.Signals(signum).name, in_flight, on_drain)
        finally:
            if holding():
                install_hold()

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
        if self.startup_scope is None:
            log.warning("%s during set-up: stopping it (a source still loading is left behind); run the same "
                        "command to resume.", name)
            self.setup_scope.cancel()
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
