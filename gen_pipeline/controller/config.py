"""The controller's tunables and its statistics snapshot (frozen dataclasses, no logic)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerConfig:
    """Tunables of the concurrency controller; the defaults need no per-dataset tuning.

    Read from the `[controller]` table of `datasets_cfg/server.toml` when present (all optional):

        [controller]
        target_usage = 0.92
        max_window = 4096
    """

    # Share of the KV pool the model-based window aims to fill with running requests. Below 1
    # because request lengths vary: the sum of live KV fluctuates around its mean and SGLang
    # retracts the moment it touches the pool (scheduler.py update_running_batch).
    target_usage: float = 0.92
    # The model's window adds requests queued beyond its decode slots, so a freed slot refills on
    # the next scheduler step instead of after a client round trip: a share of the slots, clamped.
    queue_slack_frac: float = 0.05
    queue_slack_min: int = 2
    queue_slack_max: int = 32
    # Under live load the window is running + a queue for SGLang's admission (controller/feed.py):
    # queue_frac x running, warm_queue_frac x running while SGLang warms up (until new_token_ratio is
    # within warm_ratio_factor x its floor), clamped to [queue_min, queue_max].
    queue_frac: float = 0.5
    warm_queue_frac: float = 2.0
    queue_min: int = 4
    queue_max: int = 512
    warm_ratio_factor: float = 1.5
    # The queue is sized on the most requests SGLang ran within the last running_peak_s, not on the last
    # poll alone: a wave of finishes reads as a dip in running for a poll or two before SGLang's next
    # admission round, and a window that shrank with it left that round an empty queue (the H200's long
    # regime: queued 0 with 30-38 running, issue 19 run 2).
    running_peak_s: float = 5.0
    # The first cohort (controller/feed.py): from a start or restart until cohort_turnover x the cohort
    # has completed, the window is at most target_usage x C / F, F the mean prompt + completion tokens
    # of the completions seen (no cap before the first). 0 turns it off. The requests SGLang admits
    # when its warm-up ends are all of one age and grow together: flooded, the H200's long regime
    # overran the pool 4.5-6 s after a start (docs/measurements.md, issue 19).
    cohort_turnover: float = 0.5
    # The retraction guard (off by default): the model of the pool caps that window while the pool fills
    # (token_usage at or above guard_usage_frac x target_usage) within retraction_cooldown_s of a
    # retraction, leaving SGLang at most queue_min to admit. Off because a retraction costs SGLang only a
    # re-prefill (generated tokens are kept) and the cap starves its admission for the cooldown: with
    # eager admission (--schedule-conservativeness 0.3, 900 long prompts, simulated) the guard cost 4.5 %
    # (0.969 x flooding against 1.014 without it), while at the 88K scale it changed no median (issue 19).
    # With it off, retraction bursts still cap growth (retraction_burst_*) and the climb still runs.
    retraction_guard: bool = False
    guard_usage_frac: float = 0.8
    min_window: int = 1
    max_window: int = 4096
    # The initial tokens-per-request estimate counts as this many completions in the running
    # estimate, so the first (short-biased: short requests finish first) completions move it slowly.
    prior_weight: float = 32.0
    history: int = 512  # completions kept for the running length estimates
    # Hill climb on measured goodput: one epoch per probe; its length follows the request
    # latency (a window change shows in the KV only as the requests it admits grow).
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
    # Retraction guard: a burst (this share of running requests, at least burst_min, in one
    # poll) steps the multiplier back and forbids growth for the cooldown. A few retractions are
    # SGLang's own optimism at work (flooding the H200 with long requests retracted 0-3 per run) and
    # cost only their prefill again (generated tokens are kept): not a storm.
    retraction_burst_frac: float = 0.03
    retraction_burst_min: int = 4
    retraction_backoff: float = 0.9
    retraction_cooldown_s: float = 30.0
    # A probe up is rejected when more requests were retracted than this share of completions.
    retraction_max_share: float = 0.1
    # Latency-gradient mode (no capacity known): start, and back off when the time per output
    # token of recent completions exceeds tolerance x that of the best epoch (Gradient2's rule).
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
