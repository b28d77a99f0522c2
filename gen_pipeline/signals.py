"""The signals that stop a run (SIGINT, SIGTERM, SIGHUP), held from the CLI's first line until a job listens
(run/shutdown.py). Standard library only: a signal during the imports must not kill the process without its
summary, its lock left."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}  # 128 + the signal's number, as a shell reports it
_held: list[str] = []  # signals received while held and no job listened yet (oldest first)
_depth = 0  # hold_signals scopes entered


def _hold(signum: int, frame: FrameType | None) -> None:
    _held.append(signal.Signals(signum).name)


def install_hold() -> None:
    for signum in SIGNALS:
        signal.signal(signum, _hold)


def holding() -> bool:
    return _depth > 0


def take_held() -> str | None:
    """The oldest signal held and not yet taken (None when none is)."""
    return _held.pop(0) if _held else None


@contextmanager
def hold_signals(*, redeliver: bool = False) -> Iterator[None]:
    """While inside, the signals are held (a job's Shutdown takes them while it listens). On the way out the
    previous handlers are back and a held signal is dropped, or with `redeliver` sent again to them (the
    CLI's outermost scope). Off the main thread: nothing."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    install_hold()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        pending = list(_held) if redeliver else []
        _held.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for name in pending:
            signal.raise_signal(getattr(signal, name))
