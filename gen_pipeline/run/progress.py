"""What the user sees while a run goes: a tqdm bar on a terminal, plain log lines otherwise, both drawn from the
job's RunSnapshot (`RunOptions.on_progress = Progress(...).update`)."""

from __future__ import annotations

import math
import sys
import time
from contextlib import AbstractContextManager
from typing import TextIO

from tqdm import tqdm

from gen_pipeline.display import count, format_duration, write_line
from gen_pipeline.records import RunSnapshot


def postfix(s: RunSnapshot) -> str:
    """The figures after done/target: throughput, in flight, the server's load, the controller."""
    parts = [f"{s.tokens_per_s:,.0f} tok/s"]
    if s.final:  # the last poll's load is from before the end: the run's peaks instead
        peak, running, queued, kv = "peak ", s.peak_running, s.peak_queued, s.peak_kv_usage
    else:
        peak, running, queued, kv = "", s.running, s.queued, s.kv_usage
        if s.server_wait_s is not None:  # an outage: the figures below are from before it
            limit = f" of {format_duration(s.server_wait_limit_s)}" if s.server_wait_limit_s is not None else ""
            parts.insert(0, f"no server answers: waiting {format_duration(s.server_wait_s)}{limit}")
        if s.in_flight > s.window:  # the window shrank; requests already sent still finish
            parts.append(f"in flight {count(s.in_flight)} (window lowered to {count(s.window)}; "
                         f"{count(s.in_flight - s.window)} finishing before new ones)")
        else:
            parts.append(f"in flight {count(s.in_flight)}/{count(s.window)}")
        if s.readers:  # where the answers are read (the main process's CPU past half a core)
            parts.append(f"{s.readers} reader process{'es' if s.readers > 1 else ''}")
    if running is not None:
        parts.append(f"{peak}running {count(running)} queued {count(queued or 0)}")
    if kv is not None:
        parts.append(f"{peak}KV {kv:.0%}")
    if s.retractions_run:  # this run's, not an attached server's lifetime count
        parts.append(f"retracted {s.retractions_run}")
    if s.failures:
        parts.append(f"failed {s.failures}")
    if s.controller_mode is not None and not s.final:
        parts.append(f"controller {s.controller_mode}: {s.controller_reason}")
    return ", ".join(parts)


class Progress(AbstractContextManager["Progress"]):
    """`update()` redraws the bar or prints a line every `log_every_s`; `close()` ends the bar (log mode: prints
    the last figures a short run may never have shown)."""

    def __init__(self, label: str = "", *, mode: str = "auto", stream: TextIO | None = None,
                 log_every_s: float = 10.0):
        self.label = label  # used when a snapshot has none
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self._stream.isatty() else "log"
        self.mode = mode
        self._log_every_s = log_every_s
        self._last_log = -math.inf  # the first update always prints
        self._bar: tqdm | None = None
        self._last: RunSnapshot | None = None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, s: RunSnapshot) -> None:
        label = s.label or self.label
        self._last = s
        if self.mode == "bar" and self._bar is None:
            self._bar = tqdm(total=s.target, initial=s.done, desc=label, unit="sample",
                             file=self._stream, dynamic_ncols=True, smoothing=0.05)
        if self._bar is not None:
            if label != self.label:
                self._bar.set_description_str(label, refresh=False)
            self._bar.n = s.done
            self._bar.set_postfix_str(postfix(s), refresh=False)
            self._bar.refresh()
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._last_log >= self._log_every_s:
                self._last_log = now
                self.log_line(s)
                self._last = None  # printed: close() has nothing left to print
        self.label = label

    def log_line(self, s: RunSnapshot) -> None:
        pct = 100.0 * s.done / s.target if s.target else 100.0
        eta = "" if s.done >= s.target else f", eta {format_duration(s.eta_s)}"
        line = (f"{s.label or self.label} {s.done:,}/{s.target:,} ({pct:.1f}%) {s.samples_per_s:.2f} samples/s, "
                f"{postfix(s)}{eta}")
        if not write_line(line, self._stream):
            self.mode = "quiet"  # its reader has gone (`... 2>&1 | tee` after Ctrl-C): the run goes on

    def close(self) -> None:
        if self._bar is not None:
            self._bar.refresh()
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self._last is not None:
            self.log_line(self._last)
            self._last = None
