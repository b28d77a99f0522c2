"""Feeding SGLang's admission (pure): a request it could admit that is not there is a decode slot lost, a queue
beyond what it admits before the client refills is only waiting. So window = R + clamp(queue_frac x R, queue_min,
queue_max), R the most running within running_peak_s (warm_frac x R while SGLang warms up); until cohort_turnover of
the first cohort completed, at most u x C / F (docs/measurements.md, "short and long outputs")."""

from __future__ import annotations

from dataclasses import dataclass

# SGLang's floor of new_token_ratio as a share of its initial value (SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
# managers/scheduler_components/new_token_ratio_tracker.py:27-30, environ.py:396).
RATIO_FLOOR_FACTOR = 0.14


@dataclass(frozen=True, slots=True)
class QueueBound:
    """The queue kept at the server: a share of running, clamped (see the module doc)."""

    frac: float
    warm_frac: float
    minimum: int
    maximum: int

    def allowance(self, running: int, warming: bool) -> int:
        """Requests to keep queued beyond `running`: frac x running, warm_frac x running while SGLang
        warms up; clamped to [minimum, maximum]."""
        return int(min(self.maximum, max(self.minimum, (self.warm_frac if warming else self.frac) * running)))


class WarmUp:
    """Is SGLang's admission still in its cautious start? Warming from construction and `restart()` until
    the reported new_token_ratio falls to `factor` x its floor (or, with no ratio reported, the first
    completion); a ratio that jumps up after a retraction is SGLang turning careful, not a warm-up."""

    def __init__(self, factor: float) -> None:
        self._factor, self.warming, self._ratio_max = factor, True, 0.0

    def restart(self) -> None:
        self.warming, self._ratio_max = True, 0.0

    def observe_ratio(self, ratio: float | None) -> None:
        if not self.warming or ratio is None or ratio <= 0:
            return
        self._ratio_max = max(self._ratio_max, ratio)
        if ratio <= self._factor * RATIO_FLOOR_FACTOR * self._ratio_max:
            self.warming = False

    def observe_completion(self, ratio_reported: bool) -> None:
        if not ratio_reported:
            self.warming = False
