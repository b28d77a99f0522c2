"""The controller's tunables and its statistics snapshot (frozen dataclasses, no logic)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerConfig:
    """Tunables of the concurrency controller (the defaults need no per-dataset tuning), all optional, from
    `datasets_cfg/server.toml`:

        [controller]
        target_usage = 0.92
        max_window = 4096
    """

    # Share of the KV pool the model aims to fill: below 1 because the live KV fluctuates around its
    # mean and SGLang retracts the moment it touches the pool (scheduler.py update_running_batch).
    target_usage: float = 0.92
    # The model's window adds a queue of a share of its slots, so a freed slot refills on the next step.
    queue_slack_frac: float = 0.05
    queue_slack_min: int = 2
    queue_slack_max: int = 32
    # Under load: running + a queue for SGLang's admission, warm_queue_frac while it warms up (controller/feed.py).
    queue_frac: float = 0.5
    warm_queue_frac: float = 2.0
    queue_min: int = 4
    queue_max: int = 512
    warm_ratio_factor: float = 1.5
    # The queue is sized on the peak running within this span, not the last poll (a wave of finishes dips it).
    running_peak_s: float = 5.0
    # The first-cohort cap after a (re)start lasts until this share of the cohort completed (controller/feed.py);
    # 0 turns it off.
    cohort_turnover: float = 0.5
    # The retraction guard caps the window by the model while the pool fills after a retraction. Off: a
    # retraction costs SGLang only a re-prefill and the cap starved its admission (docs/measurements.md,
    # "controller"); bursts still cap growth (retraction_burst_*).
    retraction_guard: bool = False
    guard_usage_frac: float = 0.8
    min_window: int = 1
    max_window: int = 4096
    # The prior counts as this many completions, so the first (short-biased) completions move it slowly.
    prior_weight: float = 32.0
    history: int = 512  # completions kept for the running length estimates
    # Hill climb on measured goodput, one epoch per probe; an epoch's length follows the request latency.
    epoch_latency_frac: float = 0.5
    epoch_min_s: float = 20.0
    epoch_max_s: float = 300.0
    epoch_min_completions: int = 8
    settle_frac: float = 0.3  # first part of an epoch is transition, not measured
    climb_step: float = 0.1  # relative change of the climbed multiplier per probe
    climb_step_min: float = 0.025  # below this the climb has converged and holds
    climb_noise: float = 0.02  # relative goodput change treated as noise
    reprobe_epochs: int = 8  # epochs held after converging before probing again
    gain_min: float = 0.6  # bounds of the multiplier on the model's slots
    gain_max: float = 1.8
    # A burst (this share of running, at least burst_min, in one poll) steps the gain back and forbids
    # growth for the cooldown; a few retractions are SGLang's own optimism.
    retraction_burst_frac: float = 0.03
    retraction_burst_min: int = 4
    retraction_backoff: float = 0.9
    retraction_cooldown_s: float = 30.0
    # A probe up is rejected when more requests were retracted than this share of completions.
    retraction_max_share: float = 0.1
    # The batch ceiling (controller/batch.py): the knee's drop, polls per bin, headroom, and the climb's step.
    batch_cap_step: float = 0.05
    knee_drop: float = 0.25
    knee_polls: int = 5
    knee_headroom: float = 1.5
    # No capacity known: the start window, and Gradient2's back-off when TPOT exceeds tolerance x the best's.
    gradient_initial_window: int = 32
    gradient_tolerance: float = 2.0
    gradient_step: float = 0.5


@dataclass(frozen=True, slots=True)
class ControllerStats:
    """A snapshot for the progress bar and the logs."""

    window: int
    mode: str  # "load" (capacity + live load), "model" (capacity, no load seen), "gradient"
    tokens_per_request: float  # F: prompt + completion tokens a request holds at its end
    held_tokens_per_request: float  # mean KV a running request holds (what sizes the window)
    gain: float  # climbed multiplier on the model's slots (gradient mode: 1.0)
    goodput_tok_s: float | None  # last measured epoch goodput
    running: int | None
    queued: int | None
    token_usage: float | None
    retractions: int | None  # cumulative, as the server reports it
    completions: int
    reason: str  # short text of the last decision
