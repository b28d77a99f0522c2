"""Feeding SGLang's admission: the queue the client keeps at the server (pure arithmetic).

SGLang decides how many requests run. Each prefill round it admits waiting requests while
prompt + min(max_new_tokens, 4096) + 1 still fits under free KV minus new_token_ratio x the clipped
remaining max_new_tokens of every running request (schedule_policy.py PrefillAdder), and after a
refusal it admits nothing more until a request finishes (scheduler.py batch_is_full). A request it
could admit that is not there is a decode slot lost; a queue beyond what it admits before the
client refills is only waiting (timeouts, client memory, retried on a restart). So the client keeps
a bounded queue at the server:

    window = R + queue,   queue = clamp(queue_frac x R, queue_min, queue_max)

R being the most requests SGLang ran within the last few seconds (ControllerConfig.running_peak_s),
which SGLang draws on at every admission round and the client refills at every completion and poll.
Not the last poll's running alone: a wave of finishes shows as a dip for a poll or two before SGLang's
next admission round, and a window shrunk with it left that round an empty queue. That is the bound:
queued at the server <= window - running = queue + (R - running), at most (1 + queue_frac) x R.

Warm-up. After a start or restart new_token_ratio is 0.7 (x --schedule-conservativeness) and
decays to 0.14 x that over 600 decode steps (~2 s on an H200); SGLang's first round takes only what
fits with every candidate reserving its whole clipped max_new (13 requests of max_new 4096 in
60,000 tokens), a second round a few more, then nothing until the first request finishes, when it
admits many at once (16 -> ~40 within a second on the H200). A queue that builds then is SGLang's
caution, not a full server. Until SGLang's admission has warmed up -- the ratio /metrics reports
(the last prefill round's) has come down to within `warm_ratio_factor` of its floor, or, without
that gauge, a request has completed since the start -- the queue allowed is warm_frac x running
(2 x running by default): the first admission bursts find candidates waiting, as with a fixed
window at the slot count.

The first cohort. The requests SGLang admits when its warm-up ends are all of one age: none finishes
before the shortest output and all grow together, so the pool holds C / F of them at their end (F:
prompt + completion), not the C / H of a pool of mixed ages. Flooded, the H200's long regime overran the
pool 4.5-6 s after every start that retracted (48-56 running; docs/measurements.md, issue 19). So from a
start or restart until cohort_turnover x (u x C / F) requests have completed, the window is at most
u x C / F (F: the mean of the completions seen; no cap before the first), never below running + in
transit + queue_min. A cap only lowers the window: the bound below holds as stated.

The bound, stated: queued <= R - running + max(queue_min, queue_frac x R)
once warm, R - running + max(queue_min, warm_frac x R) for the few seconds of a warm-up, the queue
part never above queue_max.
"""

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
    """Is SGLang's admission still in its cautious start (new_token_ratio far above its floor)?

    Starts warming at construction and at `restart()`; ends for good (until the next restart) once the
    reported ratio has fallen to `factor` x its floor (0.14 x the highest ratio seen since the
    restart), or, while no ratio is reported, at the first completion since the restart. A ratio
    that jumps up after a retraction is SGLang turning careful on purpose, not a warm-up."""

    def __init__(self, factor: float) -> None:
        self._factor = factor
        self.warming = True
        self._ratio_max = 0.0

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
