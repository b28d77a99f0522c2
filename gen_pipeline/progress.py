"""What the user sees while a run goes: a tqdm bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm


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

    @property
    def eta_s(self) -> float | None:
        left = self.target - self.done
        return left / self.samples_per_s if self.samples_per_s > 0 and left > 0 else None

    def postfix(self) -> str:
        parts = [f"{self.tokens_per_s:,.0f} tok/s", f"in flight {self.in_flight}/{self.window}"]
        if self.running is not None:
            parts.append(f"running {self.running} queued {self.queued}")
        if self.kv_usage is not None:
            parts.append(f"KV {self.kv_usage:.0%}")
        if self.retractions:
            parts.append(f"retracted {self.retractions}")
        if self.failures:
            parts.append(f"failed {self.failures}")
        return ", ".join(parts)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    """`update()` as often as you like; it redraws the bar or prints a line every `log_every_s`."""

    def __init__(self, dataset: str, done: int, target: int, *, mode: str = "auto",
                 stream: TextIO | None = None, log_every_s: float = 10.0):
        self.dataset = dataset
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self._stream.isatty() else "log"
        self.mode = mode
        self._log_every_s = log_every_s
        self._last_log = -math.inf  # the first update always prints
        self._bar = None
        self._last: Figures | None = None
        if mode == "bar":
            self._bar = tqdm(total=target, initial=done, desc=dataset, unit="sample", file=self._stream,
                             dynamic_ncols=True, smoothing=0.05)

    def update(self, f: Figures) -> None:
        self._last = f
        if self._bar is not None:
            self._bar.n = f.done
            self._bar.set_postfix_str(f.postfix(), refresh=False)
            self._bar.refresh()
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._last_log >= self._log_every_s:
                self._last_log = now
                self.log_line(f)

    def log_line(self, f: Figures) -> None:
        pct = 100.0 * f.done / f.target if f.target else 100.0
        print(f"{self.dataset} {f.done:,}/{f.target:,} ({pct:.1f}%) {f.samples_per_s:.2f} samples/s, "
              f"{f.postfix()}, eta {format_duration(f.eta_s)}", file=self._stream, flush=True)

    def close(self) -> None:
        """Close the bar; in log mode, print the last figures (a short run may never reach a log tick)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self._last is not None:
            self.log_line(self._last)
            self._last = None
