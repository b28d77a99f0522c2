"""The batch ceiling: past SGLang's CUDA-graph ceiling (`cuda_graph_max_bs`) a decode batch runs eagerly at about
twice the step time, and neither SGLang's admission nor the feed knows. The cap starts at that ceiling, else at a
knee seen in the load polls; once in force, measured goodput moves it both ways (climb.py)."""

from __future__ import annotations

import math
from collections import defaultdict

from gen_pipeline.controller.climb import ClimbVerdict, HillClimber

_BIN = 16  # requests per bin of the running count the knee is looked for in


class BatchCap:
    """A climbed cap on requests in flight, in force once a ceiling is known or a knee is seen."""

    def __init__(self, ceiling: int | None, *, step: float, step_min: float, noise: float, reprobe_epochs: int,
                 knee_drop: float, knee_polls: int, knee_headroom: float) -> None:
        self._params = (step, step_min, noise, reprobe_epochs)
        self._knee_drop, self._knee_polls, self._knee_headroom = knee_drop, knee_polls, knee_headroom
        self._rates: dict[int, list[float]] = defaultdict(list)  # running bin -> gen_throughput polls
        self.source = ""
        self._climber: HillClimber | None = None
        if ceiling:
            self._start(ceiling, ceiling, f"the server's CUDA-graph ceiling ({ceiling})")

    @property
    def in_force(self) -> bool:
        return self._climber is not None

    @property
    def value(self) -> float:
        """The most requests to keep in flight (inf while no ceiling is known)."""
        return self._climber.value if self._climber is not None else math.inf

    def observe(self, running: int, gen_throughput: float | None) -> str | None:
        """One load poll; returns a reason when it revealed a knee (the cap comes into force)."""
        if self._climber is not None or gen_throughput is None or running <= 0 or gen_throughput <= 0:
            return None
        self._rates[running // _BIN].append(gen_throughput)
        means = {b: sum(v) / len(v) for b, v in self._rates.items() if len(v) >= self._knee_polls}
        if len(means) < 2:
            return None
        best = max(means, key=lambda b: means[b])
        worse = [b for b in means if b > best + 1 and means[b] < (1 - self._knee_drop) * means[best]]
        if not worse:
            return None
        knee = (best + 1) * _BIN - 1
        slow = min(worse)
        self._start(knee, max(knee, self._knee_headroom * knee),
                    f"decode rate fell {1 - means[slow] / means[best]:.0%} above {knee} running "
                    f"({means[best]:,.0f} -> {means[slow]:,.0f} tok/s at {slow * _BIN}+)")
        return f"batch ceiling at {knee}: {self.source}"

    def binds(self, running_peak: int) -> bool:
        """The cap is what holds the batch (running within 10 % of it)."""
        return self._climber is not None and running_peak >= 0.9 * self._climber.value

    def conclude(self, goodput: float, may_grow: bool) -> ClimbVerdict:
        assert self._climber is not None
        return self._climber.conclude(goodput, may_grow=may_grow)

    def _start(self, value: float, high: float, source: str) -> None:
        step, step_min, noise, reprobe = self._params
        self.source = source
        self._climber = HillClimber(float(value), step=step, step_min=step_min, noise=noise,
                                    reprobe_epochs=reprobe, low=max(1.0, 0.5 * value), high=float(high))
