"""The concurrency controller: how many requests to keep in flight (pure policy, time is a parameter;
docs/concurrency.md). The feed (feed.py) under the pool model (gain x u x C / H requests, H the mean KV a request
holds, at most max_running_requests; the gain hill-climbed on goodput), never above the batch ceiling (batch.py) nor
what the target still needs; no capacity known: the climb runs on the window with Gradient2's latency guard."""

from __future__ import annotations

import math
from collections import deque

from gen_pipeline.controller.batch import BatchCap
from gen_pipeline.controller.climb import HillClimber
from gen_pipeline.controller.config import ControllerConfig, ControllerStats
from gen_pipeline.controller.epoch import Epoch
from gen_pipeline.controller.estimate import RequestSizes
from gen_pipeline.controller.feed import QueueBound, WarmUp
from gen_pipeline.records import Capacity, LoadSnapshot

_LIVE_ALPHA = 0.2  # EWMA weight of one poll of used_tokens / running (~5 polls memory)


class Controller:
    """State in (capacity, completions, load polls), window out. Deterministic; no clock, no I/O."""

    def __init__(self, capacity: Capacity, *, initial_tokens_per_request: float,
                 config: ControllerConfig = ControllerConfig()) -> None:
        self._cfg = config
        self._sizes = RequestSizes(initial_tokens_per_request, config.prior_weight, config.history)
        self._kinds: dict[str, RequestSizes] = {}  # per dataset of a job (empty: one dataset)
        self._mix: dict[str, float] = {}  # requests in flight per kind
        self._load: LoadSnapshot | None = None
        self._live_held: float | None = None
        self._transit = 0  # requests out at the last poll but neither running nor queued at the server
        self._running_seen: deque[tuple[float, int]] = deque()  # (t_s, running) of the recent polls
        self._queue = QueueBound(config.queue_frac, config.warm_queue_frac, config.queue_min, config.queue_max)
        self._warm = WarmUp(config.warm_ratio_factor)
        self._remaining: int | None = None
        self._last_window = 0  # what window() last returned
        self._epoch: Epoch | None = None
        self._goodput: float | None = None
        self.update_capacity(capacity)
        self._reason = "start: model of the pool" + (
            f", at most {self._batch.value:.0f} ({self._batch.source})" if self._batch.in_force else "")

    # -- observations ---------------------------------------------------------------------
    def add_kind(self, kind: str, initial_tokens_per_request: float) -> None:
        """A dataset of a job: its own length estimate, from its own prior."""
        cfg = self._cfg
        self._kinds[kind] = RequestSizes(initial_tokens_per_request, cfg.prior_weight, cfg.history)

    def set_mix(self, in_flight: dict[str, float]) -> None:
        """Requests in flight per kind (or the kind about to be sent, weight 1, when none are)."""
        active = {k for k, n in in_flight.items() if n > 0}
        before = {k for k, n in self._mix.items() if n > 0}
        self._mix = dict(in_flight)
        if active != before:
            self._epoch = None
            if before and active - before:  # a dataset joins the pool: its own sizes move the model
                self._reason = (f"dataset mix now {', '.join(sorted(active))}: held "
                                f"{self._held_tokens():.0f} tokens per request, model window "
                                f"{self._uncapped_window():.0f}")

    def observe_completion(self, now_s: float, prompt_tokens: int, completion_tokens: int,
                           latency_s: float, kind: str | None = None) -> None:
        """One request finished: its usage token counts and its latency (seconds, queue included)."""
        self._sizes.observe(prompt_tokens, completion_tokens, latency_s)
        self._warm.observe_completion(ratio_reported=self._load is not None and self._load.new_token_ratio is not None)
        if kind in self._kinds:
            self._kinds[kind].observe(prompt_tokens, completion_tokens, latency_s)
        if self._epoch is not None:
            self._epoch.add_completion(now_s, completion_tokens, latency_s)
            self._gradient_guard(now_s)
        self._tick(now_s)

    def observe_load(self, snap: LoadSnapshot, in_flight: int | None = None) -> None:
        """One poll of the server's load; counters are cumulative (a drop means a restart).
        `in_flight`: the client's requests out at that moment; those neither running nor queued are in
        transit (HTTP, the server's tokenizer) and count on top of the queue the window keeps."""
        in_effect = self._last_window or self._target_window()
        self._transit = 0 if in_flight is None else max(0, in_flight - snap.running - snap.queued)
        prev, self._load = self._load, snap
        self._remember_running(snap)
        used: float | None = snap.used_tokens
        if used is None and snap.token_usage is not None:
            used = snap.token_usage * self._capacity.max_total_num_tokens
        if used is not None and snap.running > 0:
            held = used / snap.running
            self._live_held = held if self._live_held is None else (
                self._live_held + _LIVE_ALPHA * (held - self._live_held))
        retracted = 0
        if prev is not None and prev.retractions_total is not None and snap.retractions_total is not None:
            retracted = max(0, snap.retractions_total - prev.retractions_total)
        if retracted:
            self._retracted_at_s = snap.t_s
        if self._epoch is not None:
            self._epoch.add_load(snap, retracted)
        was_warming = self._warm.warming
        self._warm.observe_ratio(snap.new_token_ratio)
        if knee := self._batch.observe(snap.running, snap.gen_throughput):
            self._epoch, self._reason = None, knee
        if retracted >= max(self._cfg.retraction_burst_min, self._cfg.retraction_burst_frac * snap.running):
            self._on_retraction_burst(snap.t_s, retracted, in_effect)
        elif was_warming and not self._warm.warming:
            self._reason = (f"SGLang's admission warmed up (new_token_ratio {snap.new_token_ratio}): "
                            f"queue = {self._cfg.queue_frac:.0%} of running")
        self._tick(snap.t_s)

    def update_capacity(self, capacity: Capacity) -> None:
        """New or restarted server(s): new pool, counters start again, the climb starts over."""
        cfg, self._capacity = self._cfg, capacity
        if capacity.max_total_num_tokens > 0:
            self._climber = HillClimber(1.0, step=cfg.climb_step, step_min=cfg.climb_step_min, noise=cfg.climb_noise,
                                        reprobe_epochs=cfg.reprobe_epochs, low=cfg.gain_min, high=cfg.gain_max)
        else:
            self._climber = HillClimber(float(capacity.max_running_requests or cfg.gradient_initial_window),
                                        step=cfg.gradient_step, step_min=cfg.climb_step_min, noise=cfg.climb_noise,
                                        reprobe_epochs=cfg.reprobe_epochs, low=float(cfg.min_window),
                                        high=float(cfg.max_window))
        self._batch = BatchCap(capacity.cuda_graph_max_bs, step=cfg.batch_cap_step, step_min=cfg.climb_step_min,
                               noise=cfg.climb_noise, reprobe_epochs=cfg.reprobe_epochs, knee_drop=cfg.knee_drop,
                               knee_polls=cfg.knee_polls, knee_headroom=cfg.knee_headroom)
        self._load, self._live_held, self._epoch, self._transit = None, None, None, 0
        self._running_seen.clear()
        self._retracted_at_s = -math.inf
        self._ceiling, self._ceiling_until_s = math.inf, -math.inf
        self._warm.restart()
        # the first wave after a (re)start = completions before climbing
        self._warmup = self._sizes.count + max(1, round(self._uncapped_window()))
        self._count_at_restart = self._sizes.count
        self._reason = "new capacity: model of the pool"

    # -- decision -------------------------------------------------------------------------
    def window(self, now_s: float, remaining: int) -> int:
        """Requests to keep in flight now: in [min_window, max_window], and never above `remaining`."""
        self._remaining = remaining
        w = min(self._target_window(), self._ceiling if now_s < self._ceiling_until_s else math.inf, self._batch.value)
        w = min(self._cfg.max_window, max(self._cfg.min_window, int(w)))
        self._last_window = max(0, min(w, remaining))
        return self._last_window

    def statistics(self) -> ControllerStats:
        load = self._load
        return ControllerStats(
            window=self._last_window, mode=self.mode, tokens_per_request=self._sizes.final_tokens,
            held_tokens_per_request=self._held_tokens(), gain=self._climber.value if self.mode != "gradient" else 1.0,
            goodput_tok_s=self._goodput, running=load.running if load else None,
            queued=load.queued if load else None, token_usage=self._usage(load) if load else None,
            retractions=load.retractions_total if load else None, completions=self._sizes.count,
            reason=self._reason)

    @property
    def mode(self) -> str:
        if self._capacity.max_total_num_tokens <= 0:
            return "gradient"
        return "load" if self._load is not None and self._usage(self._load) is not None else "model"

    # -- the model ------------------------------------------------------------------------
    def _held_tokens(self) -> float:
        """H: the model's (one dataset's estimate, or the in-flight mix of a job's datasets), or the live one."""
        weights = {k: n for k, n in self._mix.items() if n > 0 and k in self._kinds}
        total = sum(weights.values())
        model = sum(n * self._kinds[k].held_tokens for k, n in weights.items()) / total if total else None
        return max(self._sizes.held_tokens if model is None else model, self._live_held or 0.0)

    def _slots(self) -> float:
        """Decode slots the climbed model asks for (before the queue slack)."""
        if self.mode == "gradient":
            return self._climber.value
        slots = self._climber.value * self._cfg.target_usage * self._capacity.max_total_num_tokens / self._held_tokens()
        cap = self._capacity.max_running_requests
        return min(slots, cap) if cap else slots

    def _uncapped_window(self) -> float:
        slots, cfg = self._slots(), self._cfg
        return slots + int(min(cfg.queue_slack_max, max(cfg.queue_slack_min, cfg.queue_slack_frac * slots)))

    def _usage(self, snap: LoadSnapshot) -> float | None:
        if snap.token_usage is not None:
            return snap.token_usage
        c = self._capacity.max_total_num_tokens
        return snap.used_tokens / c if snap.used_tokens is not None and c > 0 else None

    def _at_running_cap(self) -> bool:
        cap = self._capacity.max_running_requests
        return cap is not None and cap != 0 and self.mode != "gradient" and self._slots() >= cap

    # -- fast rules (every poll) ------------------------------------------------------------
    def _on_retraction_burst(self, now_s: float, retracted: int, in_effect: float) -> None:
        # The window that led here is the most it may be until the cooldown ends: SGLang re-queues the
        # retracted requests and turns cautious itself (new_token_ratio jumps); the gain, which caps the
        # window once the pool fills, steps back.
        self._climber.nudge(self._climber.value * self._cfg.retraction_backoff)
        ceiling = min(in_effect, self._target_window())
        self._ceiling = min(self._ceiling, ceiling) if now_s < self._ceiling_until_s else ceiling
        self._ceiling_until_s = now_s + self._cfg.retraction_cooldown_s
        self._epoch = None
        self._reason = (f"retraction burst ({retracted} in one poll): step back, "
                        f"no growth for {self._cfg.retraction_cooldown_s:.0f} s")

    def _target_window(self) -> float:
        """The model's window with no load seen; under load, running + the queue SGLang's admission draws on
        (capped by the model once the pool fills after a retraction, with the retraction guard on)."""
        model, load = self._uncapped_window(), self._load
        if load is None or self.mode == "gradient":
            return model
        running = self._running_peak()
        feed = running + self._transit + self._queue.allowance(running, self._warm.warming)
        cohort = self._cohort_cap()
        if cohort is not None:  # never below what keeps SGLang's admission fed (queue_min queued)
            feed = min(feed, max(int(cohort), load.running + self._transit + self._cfg.queue_min))
        if self._pool_filling(load):  # the model caps; a queue SGLang is not admitting stays fed
            floor = load.running + min(load.queued, self._cfg.queue_min) if load.queued > 0 else 0
            return min(feed, max(model, floor))
        return feed

    def _cohort_cap(self) -> float | None:
        """u x C / F while the first cohort after a (re)start is young (see controller/feed.py), else None."""
        f = self._sizes.observed_final_tokens
        if not self._cfg.cohort_turnover or not f:  # none seen yet (or empty ones): no cap
            return None
        cap = self._cfg.target_usage * self._capacity.max_total_num_tokens / f
        return None if self._sizes.count - self._count_at_restart >= self._cfg.cohort_turnover * cap else cap

    @property
    def warming(self) -> bool:
        """SGLang's admission is still in its cautious start (see controller/feed.py)."""
        return self._warm.warming

    def queue_bound(self) -> int | None:
        """The most requests this window leaves queued at the server (None before any load poll)."""
        load = self._load
        if load is None or self.mode == "gradient":
            return None
        running = self._running_peak()
        return running - load.running + self._queue.allowance(running, self._warm.warming)

    def _remember_running(self, snap: LoadSnapshot) -> None:
        seen = self._running_seen
        if seen and snap.t_s < seen[-1][0]:  # a clock that went back: start over
            seen.clear()
        seen.append((snap.t_s, snap.running))
        while seen[0][0] < snap.t_s - self._cfg.running_peak_s:
            seen.popleft()

    def _running_peak(self) -> int:
        """The most requests SGLang ran within the last running_peak_s (see ControllerConfig)."""
        return max((n for _, n in self._running_seen), default=0)

    def _pool_filling(self, snap: LoadSnapshot) -> bool:
        """The pool fills and SGLang's optimism has just shown: a retraction within the cooldown (only with
        the retraction guard on)."""
        if not self._cfg.retraction_guard or snap.t_s - self._retracted_at_s > self._cfg.retraction_cooldown_s:
            return False
        usage = self._usage(snap)
        return usage is not None and usage >= self._cfg.guard_usage_frac * self._cfg.target_usage

    def _gradient_guard(self, now_s: float) -> None:
        """Gradient2's rule on TPOT: far slower than at the reference -> back off at once."""
        epoch, ref = self._epoch, self._climber.ref_objective
        if (self.mode != "gradient" or epoch is None or ref is None
                or epoch.completions < self._cfg.epoch_min_completions):
            return
        rate = epoch.tokens_per_s_per_request()
        ref_rate = ref / self._climber.ref_value  # goodput = window * rate
        if rate is not None and rate * self._cfg.gradient_tolerance < ref_rate:
            factor = max(0.5, self._cfg.gradient_tolerance * rate / ref_rate)
            self._climber.nudge(self._climber.value * factor)
            self._epoch = None
            self._reason = f"TPOT {ref_rate / rate:.1f}x the reference: back off x{factor:.2f}"

    # -- slow rule (epochs) -------------------------------------------------------------------
    def _tick(self, now_s: float) -> None:
        if self._sizes.count < self._warmup and self.mode != "gradient":
            return
        if self._remaining is not None and self._remaining < min(self._uncapped_window(), self._batch.value):
            self._epoch = None  # the job is draining: goodput falls whatever the window
            return
        if self._epoch is None:
            self._start_epoch(now_s)
        elif self._epoch.ready(now_s):
            self._conclude_epoch(now_s)

    def _start_epoch(self, now_s: float) -> None:
        cfg = self._cfg
        latency = self._sizes.mean_latency_s or cfg.epoch_min_s
        frac = cfg.epoch_latency_frac if self.mode != "gradient" else 1.0
        length = min(cfg.epoch_max_s, max(cfg.epoch_min_s, frac * latency))
        self._epoch = Epoch(now_s, length, cfg.settle_frac, cfg.epoch_min_completions)

    def _conclude_epoch(self, now_s: float) -> None:
        epoch = self._epoch
        assert epoch is not None
        goodput = epoch.goodput_tok_s(self._slots())
        if goodput is None:
            self._start_epoch(now_s)
            return
        self._goodput = goodput
        in_cooldown = now_s < self._ceiling_until_s
        if self._batch.binds(self._running_peak()):  # the cap holds the batch: goodput moves the cap
            verdict = self._batch.conclude(goodput, may_grow=not in_cooldown)
            self._reason = f"{goodput:.0f} tok/s: at most {verdict.value:.0f} running, {verdict.reason}"
        else:
            penalised = epoch.retractions > self._cfg.retraction_max_share * max(1, epoch.finished)
            verdict = self._climber.conclude(goodput, may_grow=not in_cooldown and not self._at_running_cap(),
                                             penalised=penalised)
            self._reason = f"{goodput:.0f} tok/s: {verdict.reason}"
        self._start_epoch(now_s)
