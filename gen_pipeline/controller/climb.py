"""Hill climb of one positive value on a measured objective, one measurement per epoch: probe one step away, keep
it if the objective rose beyond the noise, else go back and try the other way with half the step. Below `step_min`
it holds for `reprobe_epochs`, then probes again (a slowly moving optimum is followed; a flat one leaves it put)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClimbVerdict:
    value: float
    reason: str


class HillClimber:
    """Multiplicative steps: value * (1 + step) ** direction, clamped to [low, high]."""

    def __init__(self, value: float, *, step: float, step_min: float, noise: float,
                 reprobe_epochs: int, low: float, high: float) -> None:
        self.value, self.step = value, step
        self._step_min, self._noise, self._reprobe_epochs = step_min, noise, reprobe_epochs
        self._low, self._high = low, high
        self.direction = 1
        self.phase = "measure"  # "measure" the reference, "probe" a step away, "hold" when converged
        self.ref_value = value
        self.ref_objective: float | None = None
        self._held = 0

    def nudge(self, value: float) -> None:
        """An outside rule moved the value (retraction back-off, idle growth): re-measure there."""
        self.value = self.ref_value = self._clamp(value)
        self.ref_objective, self.phase = None, "measure"

    def conclude(self, objective: float, *, may_grow: bool, penalised: bool = False) -> ClimbVerdict:
        """End of an epoch measured at `self.value`; returns the value for the next epoch. `penalised`: the
        epoch was bad for another reason (retraction share too high); a probe up is rejected."""
        if self.phase == "hold":
            self._held += 1
            self.ref_objective = objective
            if self._held < self._reprobe_epochs:
                return ClimbVerdict(self.value, f"converged, holding ({self._held}/{self._reprobe_epochs})")
            self.step, self.phase = 2 * self._step_min, "measure"
        if self.phase == "measure" or self.ref_objective is None:
            self.ref_value, self.ref_objective = self.value, objective
            return self._probe(may_grow, "measured reference")
        return self._judge(objective, may_grow, penalised)

    def _judge(self, objective: float, may_grow: bool, penalised: bool) -> ClimbVerdict:
        ref = self.ref_objective or 0.0
        change = (objective - ref) / ref if ref > 0 else 0.0
        went_up = self.value > self.ref_value
        if change > self._noise and not (went_up and penalised):
            self.ref_value, self.ref_objective = self.value, objective
            return self._probe(may_grow, f"goodput {change:+.1%}: keep going")
        # Worse, flat (a plateau or noise: staying put is the stable choice) or penalised.
        verdict = ("retractions outweigh the gain: step back" if went_up and penalised and change > self._noise
                   else f"goodput {change:+.1%}: step back")
        self.value, self.direction, self.step = self.ref_value, -self.direction, self.step / 2
        if self.step < self._step_min:
            self.phase, self._held = "hold", 0
            return ClimbVerdict(self.value, verdict + ", converged")
        self.phase = "measure"
        return ClimbVerdict(self.value, verdict)

    def _probe(self, may_grow: bool, why: str) -> ClimbVerdict:
        if self.direction > 0 and not may_grow:
            self.phase = "measure"
            return ClimbVerdict(self.value, why + ", growth not allowed now")
        target = self._clamp(self.value * (1 + self.step) ** self.direction)
        if target == self.value:  # at a bound: turn around
            self.direction = -self.direction
            target = self._clamp(self.value * (1 + self.step) ** self.direction)
        self.value, self.phase = target, "probe"
        return ClimbVerdict(target, f"{why}, probe {'up' if self.direction > 0 else 'down'}")

    def _clamp(self, value: float) -> float:
        return min(self._high, max(self._low, value))
