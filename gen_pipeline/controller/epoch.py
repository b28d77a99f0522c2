"""One measurement epoch of the hill climb: goodput at a fixed setting (pure arithmetic)."""

from __future__ import annotations

from gen_pipeline.records import LoadSnapshot


class Epoch:
    """Goodput measured between `measure_from_s` and the end of the epoch: the server's mean decode rate
    (gen_throughput, smooth), else its generated-tokens counter (noisy), else Little's law."""

    def __init__(self, start_s: float, length_s: float, settle_frac: float, min_completions: int) -> None:
        self.start_s, self.length_s = start_s, length_s
        self.measure_from_s = start_s + settle_frac * length_s
        self._min_completions = min_completions
        self._gen_first: tuple[float, int] | None = None
        self._gen_last: tuple[float, int] | None = None
        self._rate_sum, self._rate_polls = 0.0, 0
        self.completions = 0  # completions counted for Little's law (started inside the epoch)
        self.finished = 0  # completions in the measured part, any start
        self._tokens, self._latency_s, self.retractions = 0, 0.0, 0

    def add_load(self, snap: LoadSnapshot, retracted: int) -> None:
        if snap.t_s < self.measure_from_s:
            return
        self.retractions += retracted
        if snap.gen_throughput is not None:
            self._rate_sum += snap.gen_throughput
            self._rate_polls += 1
        if snap.gen_tokens_total is not None:
            point = (snap.t_s, snap.gen_tokens_total)
            if self._gen_first is None:
                self._gen_first = point
            else:
                self._gen_last = point

    def add_completion(self, now_s: float, completion_tokens: int, latency_s: float) -> None:
        if now_s >= self.measure_from_s:
            self.finished += 1
        if now_s - latency_s >= self.start_s and completion_tokens > 0:
            self.completions += 1
            self._tokens += completion_tokens
            self._latency_s += latency_s

    def ready(self, now_s: float) -> bool:
        if now_s < self.start_s + self.length_s:
            return False
        return self._rate_polls >= 2 or self._counter_span() is not None or self.completions >= self._min_completions

    def tokens_per_s_per_request(self) -> float | None:
        """1 / TPOT over the epoch's own completions (queue time included), None if none."""
        return self._tokens / self._latency_s if self._latency_s > 0 else None

    def goodput_tok_s(self, window: float) -> float | None:
        if self._rate_polls >= 2:
            return self._rate_sum / self._rate_polls
        span = self._counter_span()
        if span is not None:
            (t0, g0), (t1, g1) = span
            return (g1 - g0) / (t1 - t0)
        rate = self.tokens_per_s_per_request()
        return window * rate if rate is not None else None

    def _counter_span(self) -> tuple[tuple[float, int], tuple[float, int]] | None:
        """The first and last (time, generated tokens) counter points, if they span some time."""
        first, last = self._gen_first, self._gen_last
        if first is None or last is None or last[0] <= first[0]:
            return None
        return first, last
