"""Signals, for the whole of a job (job.py `open_job` to its last store closed), and before it.

From `generate`'s start (`hold_signals`, entered by the CLI first thing) a SIGINT/SIGTERM never kills
the process: until a job listens it is held, and the job acts on it the moment it does (the set-up
then stops at once). During the set-up (run/setup.py: the model asked, the stores claimed, the sources
loaded) the first signal stops it: a source load in a worker thread (`datasets` cannot be interrupted)
is abandoned, every store claimed so far is released, and the summary follows. Before the server
answers (launch mode: SGLang loading), the first stops the start-up (the server's process group is
stopped on the way out); once requests go, the first drains (no new requests, in-flight ones get
drain_grace_s) and the second cancels the requests at once. Any later one (the server being stopped,
the stores being committed) is noted and ignored: the run always ends with its summary, 130/143 and
its locks released. The scopes are entered by setup.py and job.py."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import anyio

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_held: list[str] = []  # signals received while held and no job listened yet (oldest first)
_holding = False


def _hold(signum: int, frame: FrameType | None) -> None:
    _held.append(signal.Signals(signum).name)


def _install_hold() -> None:
    for signum in SIGNALS:
        signal.signal(signum, _hold)


@contextmanager
def hold_signals() -> Iterator[None]:
    """While inside, SIGINT/SIGTERM are held instead of ending the process (main thread only): a job's
    Shutdown takes them when it starts listening, and holds again once it stops (anyio resets the
    dispositions to the defaults when its receiver closes). A signal held after the job ended is dropped:
    the run is over, its summary said how. The previous handlers are restored on the way out."""
    global _holding
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _install_hold()
    _holding = True
    try:
        yield
    finally:
        _holding = False
        _held.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Shutdown:
    def __init__(self, drain_grace_s: float) -> None:
        self.drain_grace_s = drain_grace_s
        self.signal: str | None = None  # "SIGINT" | "SIGTERM" once one arrived
        self.setup_scope = anyio.CancelScope()  # the set-up's (setup.py open_datasets)
        self.producer_scope = anyio.CancelScope()
        self.requests_scope = anyio.CancelScope()  # replaced by the requests task group's scope
        self.startup_scope: anyio.CancelScope | None = None  # the job's, until the server answers
        self.serving = False  # the server answered: a signal drains instead of stopping the start-up
        self._count = 0

    async def handle_signals(self, in_flight: Callable[[], int], on_drain: Callable[[], None], *,
                             task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: first signal → stop the set-up or the start-up, or `on_drain()` and a drain
        deadline; second → cancel requests; later ones are only logged. Started with `tg.start`: it
        listens once started, and has acted on the signals held before (hold_signals)."""
        try:
            with anyio.open_signal_receiver(*SIGNALS) as signals:
                while _held:
                    self.on_signal(_held.pop(0), in_flight, on_drain)
                task_status.started()
                async for signum in signals:
                    self.on_signal(signal.Signals(signum).name, in_flight, on_drain)
        finally:
            if _holding:
                _install_hold()

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
