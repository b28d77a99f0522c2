"""What the user sees while a run goes: a tqdm bar on a terminal, plain log lines otherwise.

`Progress` also prints the run's events (records of the `gen_pipeline` logger) on stdout, as before
the bar's figures (stderr), through the bar's own writer while a bar is shown, so an event never lands
on the bar's line. The
bar appears with the first figures, once the server is up: start-up messages come before it.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm

from gen_pipeline.display import format_duration


@dataclass(frozen=True, slots=True)
class Figures:
    """One snapshot of a run, as the bar and the log lines show it."""

    done: int
    target: int
    samples_per_s: float
    tokens_per_s: float
    in_flight: int
    window: int
    running: int | None = None
    queued: int | None = None
    kv_usage: float | None = None
    retractions: int | None = None
    failures: int = 0
    controller_mode: str | None = None  # the controller's statistics(): mode and its last decision
    controller_reason: str | None = None
    final: bool = False  # the line after the run: nothing in flight, no live load figures
    peak_running: int | None = None  # highest figures of the run's load polls (the final line's)
    peak_queued: int | None = None
    peak_kv_usage: float | None = None

    @property
    def eta_s(self) -> float | None:
        left = self.target - self.done
        return left / self.samples_per_s if self.samples_per_s > 0 and left > 0 else None

    def postfix(self) -> str:
        parts = [f"{self.tokens_per_s:,.0f} tok/s"]
        if self.final:  # the last poll's load is from before the end: the run's peaks instead
            if self.peak_running is not None:
                parts.append(f"peak running {self.peak_running} queued {self.peak_queued}")
            if self.peak_kv_usage is not None:
                parts.append(f"peak KV {self.peak_kv_usage:.0%}")
            if self.retractions:
                parts.append(f"retracted {self.retractions}")
            return ", ".join(parts + ([f"failed {self.failures}"] if self.failures else []))
        if self.in_flight > self.window:  # the window shrank; requests already sent still finish
            parts.append(f"in flight {self.in_flight} (window lowered to {self.window}; "
                         f"{self.in_flight - self.window} finishing before new ones)")
        else:
            parts.append(f"in flight {self.in_flight}/{self.window}")
        if self.running is not None:
            parts.append(f"running {self.running} queued {self.queued}")
        if self.kv_usage is not None:
            parts.append(f"KV {self.kv_usage:.0%}")
        if self.retractions:
            parts.append(f"retracted {self.retractions}")
        if self.failures:
            parts.append(f"failed {self.failures}")
        if self.controller_mode is not None:
            parts.append(f"controller {self.controller_mode}: {self.controller_reason}")
        return ", ".join(parts)


class _EventHandler(logging.Handler):
    """Prints event records above the bar (tqdm.write) or as plain lines."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.INFO)
        self._progress = progress
        self.addFilter(lambda record: getattr(record, "console", True))  # file-only records say console=False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._progress.write_event(self.format(record))
        except Exception:  # a display problem must not end the run
            self.handleError(record)


class Progress:
    """`update()` as often as you like; it redraws the bar or prints a line every `log_every_s`.
    Use as a context manager to show the run's events on the same stream."""

    def __init__(self, dataset: str, done: int, target: int, *, mode: str = "auto",
                 stream: TextIO | None = None, log_every_s: float = 10.0, events: TextIO | None = None):
        self.dataset = dataset
        self._stream = stream or sys.stderr
        self._events_stream = events or sys.stdout
        if mode == "auto":
            mode = "bar" if self._stream.isatty() else "log"
        self.mode = mode
        self._log_every_s = log_every_s
        self._last_log = -math.inf  # the first update always prints
        self._bar: tqdm | None = None
        self._last: Figures | None = None
        self._events = _EventHandler(self)
        self._logger = logging.getLogger("gen_pipeline")
        self._level = logging.NOTSET

    def __enter__(self) -> Progress:
        self._logger.addHandler(self._events)
        self._level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)  # events are INFO; an embedding app's own level otherwise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._logger.removeHandler(self._events)
        self._logger.setLevel(self._level)

    def set_label(self, label: str) -> None:
        """What the bar and the log lines are about (a job: the dataset being sent)."""
        if label != self.dataset:
            self.dataset = label
            if self._bar is not None:
                self._bar.set_description_str(label, refresh=False)

    def write_event(self, line: str) -> None:
        """One event line, above the bar when one is shown."""
        if self._bar is not None:
            self._bar.write(line, file=self._events_stream)
        else:
            print(line, file=self._events_stream, flush=True)

    def update(self, f: Figures) -> None:
        self._last = f
        if self.mode == "bar" and self._bar is None:
            self._bar = tqdm(total=f.target, initial=f.done, desc=self.dataset, unit="sample",
                             file=self._stream, dynamic_ncols=True, smoothing=0.05)
        if self._bar is not None:
            self._bar.n = f.done
            self._bar.set_postfix_str(f.postfix(), refresh=False)
            self._bar.refresh()
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._last_log >= self._log_every_s:
                self._last_log = now
                self.log_line(f)
                self._last = None  # printed: close() has nothing left to print

    def log_line(self, f: Figures) -> None:
        pct = 100.0 * f.done / f.target if f.target else 100.0
        eta = "" if f.done >= f.target else f", eta {format_duration(f.eta_s)}"
        print(f"{self.dataset} {f.done:,}/{f.target:,} ({pct:.1f}%) {f.samples_per_s:.2f} samples/s, "
              f"{f.postfix()}{eta}", file=self._stream, flush=True)

    def close(self) -> None:
        """Close the bar; in log mode, print the last figures (a short run may never reach a log tick)."""
        if self._bar is not None:
            self._bar.refresh()
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self._last is not None:
            self.log_line(self._last)
            self._last = None
