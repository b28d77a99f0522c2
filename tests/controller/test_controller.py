"""The concurrency controller on synthetic load traces (pure policy: no server, time is a parameter)."""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gen_pipeline.controller import Controller, ControllerConfig
from gen_pipeline.records import Capacity, LoadSnapshot

POOL = 376_000
CFG = ControllerConfig()
GUARDED = ControllerConfig(retraction_guard=True)  # the post-retraction cap of the pool model (off by default)


def model_window(capacity: int, held: float, gain: float = 1.0, cap: int | None = None) -> int:
    """The window the docstring promises: min(cap, gain * u * C / H) + slack."""
    slots = gain * CFG.target_usage * capacity / held
    slots = min(slots, cap) if cap else slots
    slack = int(min(CFG.queue_slack_max, max(CFG.queue_slack_min, CFG.queue_slack_frac * slots)))
    return int(slots + slack)


def warm_up(ctrl: Controller, n: int, prompt: int, completion: int, now_s: float = 0.0) -> None:
    for _ in range(n):
        ctrl.observe_completion(now_s, prompt, completion, latency_s=100.0)


def snap(t_s: float, running: int, queued: int = 0, usage: float = 0.5, retractions: int = 0,
         gen: int | None = None) -> LoadSnapshot:
    return LoadSnapshot(t_s=t_s, running=running, queued=queued, used_tokens=int(usage * POOL),
                        token_usage=usage, retractions_total=retractions, gen_tokens_total=gen)


def drive(ctrl: Controller, goodput_of_window, seconds: int, t0_s: float = 1000.0, noise: float = 0.0,
          seed: int = 0) -> list[int]:
    """One load poll per second, gen_tokens_total growing at goodput_of_window(window); returns the windows.
    Running requests hold 1800 tokens each; the server admits all it is sent and retracts one every 25 s."""
    rng = random.Random(seed)
    gen, windows = 0, []
    for i in range(seconds):
        t = t0_s + i
        w = ctrl.window(t, remaining=10**9)
        windows.append(w)
        gen += int(goodput_of_window(w) * (1 + rng.uniform(-noise, noise)))
        ctrl.observe_load(snap(t, running=w - 2, queued=0, usage=(w - 2) * 1800 / POOL, gen=gen,
                               retractions=_baseline(i)))
        ctrl.observe_completion(t, 1000, 2000, latency_s=100.0)  # keeps the latency (100 s) and sizes steady
    return windows


# --- the model -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("capacity", "cap", "f0", "expected"),
    [
        (376_000, None, 4000, model_window(376_000, 4000)),  # 86 slots + 4 slack
        (116_000, None, 4300, model_window(116_000, 4300)),  # B2 on the smallest pool: 24 + 2
        (376_000, 50, 900, 52),  # max_running_requests caps the slots; slack on top
        (376_000, None, 10, 4096),  # max_window
        (1000, None, 4000, 2),  # less than one slot: min slack keeps two in flight
    ],
)
def test_initial_window_is_the_pool_model(capacity: int, cap: int | None, f0: int, expected: int) -> None:
    ctrl = Controller(Capacity(capacity, cap), initial_tokens_per_request=f0)
    assert ctrl.window(0.0, remaining=100_000) == expected
    assert ctrl.statistics().mode == "model"


def test_learns_steady_state_occupancy_from_completions() -> None:
    # 2000-token outputs on 1000-token prompts hold 2000 tokens on average (1000 + 2000/2),
    # so the window converges from C/F0 towards C/2000 as completions replace the prior.
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=3000)
    assert ctrl.window(0.0, 10**6) == model_window(POOL, 3000)
    warm_up(ctrl, 512, 1000, 2000)
    held = (32 * 3000 + 512 * 2000) / (32 + 512)
    assert ctrl.statistics().held_tokens_per_request == pytest.approx(held)
    assert ctrl.window(1.0, 10**6) == model_window(POOL, held)


def test_respects_max_running_requests() -> None:
    ctrl = Controller(Capacity(POOL, 64), initial_tokens_per_request=500)
    warm_up(ctrl, 200, 200, 300)
    assert ctrl.window(0.0, 10**6) == 64 + 3  # the model's slots stop at the server's cap
    # Under load: the 64 the server runs plus half of them queued for its next admissions.
    for t in range(1, 30):
        ctrl.observe_load(snap(float(t), running=64, queued=32, usage=0.1))
    assert ctrl.window(30.0, 10**6) == 64 + 32


@pytest.mark.parametrize(("remaining", "expected"), [(0, 0), (1, 1), (7, 7), (89, 89), (10**6, 90)])
def test_never_exceeds_remaining(remaining: int, expected: int) -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=4000)
    assert ctrl.window(0.0, remaining) == expected


# --- live load -----------------------------------------------------------------------------------

def test_grows_by_half_a_poll_while_the_server_admits_everything() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 200, 1000, 2000)  # first wave done, no ratio reported: SGLang is warm
    windows = [ctrl.window(0.0, 10**6)]
    assert windows[0] == model_window(POOL, 2000)
    for t in range(1, 6):  # e.g. shared prefixes: everything sent runs, the pool stays at 20%
        ctrl.observe_load(snap(float(t), running=windows[-1], queued=0, usage=0.2))
        windows.append(ctrl.window(float(t), 10**6))
    assert windows == [180, 270, 405, 607, 910, 1365]


@pytest.mark.parametrize(
    ("running", "queued", "usage", "expected"),
    [
        (40, 0, 0.5, 60),  # room in the pool: running + half of it queued for SGLang's next rounds
        (40, 30, 0.5, 60),  # more queued than that: no new sends until the queue is back to 20
        (6, 0, 0.1, 10),  # queue_min
        (2000, 900, 0.5, 2000 + 512),  # queue_max
        (160, 0, 0.8, 240),  # a full pool alone: SGLang's admission decides
    ],
)
def test_window_is_running_plus_a_bounded_queue(running: int, queued: int, usage: float, expected: int) -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 200, 1000, 2000)
    ctrl.observe_load(snap(1.0, running=running, queued=queued, usage=usage))
    assert ctrl.window(1.0, 10**6) == expected
    assert ctrl.queue_bound() == min(512, max(4, running // 2))


@pytest.mark.parametrize(
    ("running", "queued", "expected"),
    [
        (160, 0, 180),  # the model's window (180 at 2000 tokens held) caps the feed (240) ...
        (178, 0, 180),
        (200, 0, 180),  # ... a server running more than the model holds gets none while it admits all ...
        (200, 10, 204),  # ... but queue_min stays queued while it is SGLang that leaves requests waiting
    ],
)
def test_after_a_retraction_a_filling_pool_is_capped_by_the_model(running: int, queued: int, expected: int) -> None:
    """With the retraction guard on ([controller] retraction_guard = true)."""
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000, config=GUARDED)
    warm_up(ctrl, 200, 1000, 2000)
    ctrl.observe_load(snap(1.0, running=running, queued=queued, usage=0.8, retractions=5))
    ctrl.observe_load(snap(2.0, running=running, queued=queued, usage=0.8, retractions=6))  # one: not a burst
    assert ctrl.window(2.0, 10**6) == expected
    ctrl.observe_load(snap(33.0, running=running, queued=queued, usage=0.8, retractions=6))  # 31 s later
    assert ctrl.window(33.0, 10**6) == running + running // 2
    assert ctrl.queue_bound() == min(512, max(4, running // 2))


def _ratio_snap(t_s: float, running: int, queued: int, ratio: float | None, usage: float = 0.1) -> LoadSnapshot:
    return LoadSnapshot(t_s=t_s, running=running, queued=queued, used_tokens=int(usage * 60_000), token_usage=usage,
                        retractions_total=0, new_token_ratio=ratio)


def test_sglangs_cautious_first_round_is_not_a_full_server() -> None:
    """SGLang's first rounds run 16 while new_token_ratio decays: the queue allowed is 2 x running until the
    ratio reaches 1.5 x its floor (0.14 x 0.7), then half."""
    ctrl = Controller(Capacity(60_000, 3750), initial_tokens_per_request=400 + 2048)
    assert ctrl.window(0.0, 300) == 24  # the model's prior: 0.92 x 60,000 / 2,448 + 2
    windows = []
    for t, (running, queued, ratio) in enumerate([(16, 8, 0.7), (16, 16, 0.7), (16, 16, 0.7), (35, 0, 0.098),
                                                  (40, 12, 0.098)], start=1):
        ctrl.observe_load(_ratio_snap(float(t), running, queued, ratio))
        windows.append(ctrl.window(float(t), 300))
    assert windows == [48, 48, 48, 52, 60]
    assert ctrl.statistics().reason == "SGLang's admission warmed up (new_token_ratio 0.098): queue = 50% of running"


def test_the_first_cohort_after_a_start_is_capped_at_what_the_pool_holds_at_its_end() -> None:
    """A cohort of one age, flooded, overruns the pool together: until half of u x C / F requests have
    completed since the (re)start, the window is at most u x C / F, never below running + queue_min."""
    ctrl = Controller(Capacity(60_000, 3750), initial_tokens_per_request=400 + 2048)
    ctrl.observe_load(_ratio_snap(1.0, 17, 34, 0.7))
    assert ctrl.window(1.0, 300) == 51  # warm-up queue 2 x 17; no completion yet: no cap
    ctrl.observe_completion(2.0, 400, 1000, latency_s=2.0)  # F = 1,400: 0.92 x 60,000 / 1,400 = 39.4
    assert ctrl.window(2.0, 300) == 39
    ctrl.observe_load(_ratio_snap(3.0, 40, 11, 0.098))  # warm: the feed would be 40 + 20
    assert ctrl.window(3.0, 300) == 44  # the cap, but running 40 + queue_min 4 stay fed
    for _ in range(18):
        ctrl.observe_completion(3.5, 400, 1000, latency_s=3.0)
    assert ctrl.window(3.5, 300) == 44  # 19 completed < 0.5 x 39.4
    ctrl.observe_completion(3.6, 400, 1000, latency_s=3.0)  # 20: the cohort has half turned over
    assert ctrl.window(3.6, 300) == 60
    ctrl.update_capacity(Capacity(60_000, 3750))  # a restart: SGLang's next cohort is one age again
    ctrl.observe_load(_ratio_snap(10.0, 17, 34, 0.7))
    assert ctrl.window(10.0, 300) == 39
    off = Controller(Capacity(60_000, 3750), initial_tokens_per_request=2448,
                     config=ControllerConfig(cohort_turnover=0))
    off.observe_load(_ratio_snap(1.0, 17, 34, 0.7))
    off.observe_completion(2.0, 400, 1000, latency_s=2.0)
    assert off.window(2.0, 300) == 51


def test_a_restart_warms_up_again_and_a_retraction_ratio_jump_does_not() -> None:
    ctrl = Controller(Capacity(60_000, 3750), initial_tokens_per_request=2448)
    for t, ratio in enumerate([0.7, 0.3, 0.1, 0.6, 0.45], start=1):  # 0.6: after a retraction
        ctrl.observe_load(_ratio_snap(float(t), 20, 5, ratio))
        assert ctrl.window(float(t), 300) == (60 if t < 3 else 30)
    ctrl.update_capacity(Capacity(60_000, 3750))  # the server restarted
    ctrl.observe_load(_ratio_snap(10.0, 20, 5, 0.7))
    assert ctrl.window(10.0, 300) == 60


def test_without_the_ratio_gauge_the_first_completion_ends_the_warm_up() -> None:
    ctrl = Controller(Capacity(60_000, 3750), initial_tokens_per_request=2448)
    ctrl.observe_load(_ratio_snap(1.0, 16, 8, None))
    assert ctrl.window(1.0, 300) == 48
    ctrl.observe_completion(2.0, 400, 1100, latency_s=2.0)
    assert ctrl.window(2.0, 300) == 24


def test_never_grows_right_after_a_retraction_burst() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 100, 1000, 2000)
    ctrl.observe_load(snap(1.0, running=170, queued=10, usage=0.9, retractions=10))
    before = ctrl.window(1.0, 10**6)
    ctrl.observe_load(snap(2.0, running=160, queued=20, usage=0.9, retractions=20))  # +10 in one poll
    after = ctrl.window(2.0, 10**6)
    assert after <= before
    assert ctrl.statistics().gain == pytest.approx(0.9)
    assert ctrl.statistics().reason == "retraction burst (10 in one poll): step back, no growth for 30 s"
    # Idle pool and short completions right after: the window must not grow during the cooldown.
    for t in range(3, 32):
        ctrl.observe_load(snap(float(t), running=after, usage=0.1, retractions=20))
        warm_up(ctrl, 5, 100, 100, now_s=float(t))
        assert ctrl.window(float(t), 10**6) <= before
    ctrl.observe_load(snap(33.0, running=after, usage=0.1, retractions=20))
    assert ctrl.window(33.0, 10**6) == after + after // 2  # cooldown over: the feed grows again


def test_a_few_retractions_are_tolerated() -> None:
    """Three a poll among 170 running, below the burst threshold (4): no step back. By default SGLang's
    admission stays fed (170 running + a queue of 85); with the retraction guard on, the pool model (180)
    caps the feed for the cooldown."""
    for config, expected in ((CFG, 170 + 85), (GUARDED, 180)):
        ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000, config=config)
        warm_up(ctrl, 100, 1000, 2000)
        assert ctrl.window(0.0, 10**6) == 180  # the pool model, before any load
        for t in range(1, 10):
            ctrl.observe_load(snap(float(t), running=170, usage=0.9, retractions=3 * t))
        assert ctrl.window(10.0, 10**6) == expected
        assert ctrl.statistics().gain == 1.0
        assert not ctrl.statistics().reason.startswith("retraction burst")


# --- hill climb on goodput ----------------------------------------------------------------------

def _climbing_controller() -> tuple[Controller, int]:
    """The pool model caps the window (retraction guard on): the pool is full, SGLang has just retracted one."""
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000, config=GUARDED)
    warm_up(ctrl, 200, 1000, 2000)
    w0 = ctrl.window(997.0, 10**6)
    for t, retracted in ((998.0, 1), (999.0, 2)):
        ctrl.observe_load(snap(t, running=w0 - 2, usage=(w0 - 2) * 1800 / POOL, retractions=retracted))
    assert ctrl.window(999.0, 10**6) == w0
    return ctrl, w0


def _baseline(i: int) -> int:
    """The climbing tests' server: one retraction every 25 s (counted from the primed 2)."""
    return 2 + i // 25


def test_climbs_while_goodput_rises_then_steps_back_when_it_falls() -> None:
    ctrl, w0 = _climbing_controller()  # 172 + 8 slack
    peak = 215

    def goodput(w: int) -> float:  # rises to the peak window, falls beyond (retraction storms)
        return 10.0 * w if w <= peak else 10.0 * peak - 40.0 * (w - peak)

    windows = drive(ctrl, goodput, seconds=1500)
    assert max(windows) > peak  # it probed past the peak ...
    assert abs(windows[-1] - peak) <= 0.1 * peak  # ... and settled next to it
    assert "converged" in ctrl.statistics().reason or "holding" in ctrl.statistics().reason


def test_steps_back_when_goodput_falls() -> None:
    ctrl, w0 = _climbing_controller()
    windows = drive(ctrl, lambda w: 2000.0 if w <= w0 else 1500.0, seconds=400)
    assert max(windows) == model_window(POOL, 2000, gain=1.1)  # one probe up ...
    assert windows[-1] == w0  # ... measured worse: back to the reference
    assert windows.count(max(windows)) == 50  # exactly one epoch (50 s = half the 100 s latency)


def test_stays_put_on_a_flat_noisy_trace() -> None:
    ctrl, w0 = _climbing_controller()
    windows = drive(ctrl, lambda w: 2000.0, seconds=3000, noise=0.01, seed=7)
    tail = windows[300:]  # converged after 6 epochs: held, with small re-probes (+-5%) only
    assert min(tail) >= model_window(POOL, 2000, gain=1 / 1.05) and max(tail) <= model_window(POOL, 2000, gain=1.05)
    assert tail.count(w0) >= 0.6 * len(tail)


def test_a_probe_up_that_retracts_too_much_is_rejected() -> None:
    ctrl, w0 = _climbing_controller()
    gen, extra = 0, 0
    for i in range(300):
        t = 1000.0 + i
        w = ctrl.window(t, 10**6)
        gen += 10 * w  # goodput rises with the window (the counter does not see recompute) ...
        extra += 1 if w > w0 else 0  # ... but every second above it retracts one request more
        ctrl.observe_load(snap(t, running=w, usage=w * 1800 / POOL, retractions=_baseline(i) + extra, gen=gen))
        if i % 5 == 0:
            ctrl.observe_completion(t, 1000, 2000, latency_s=100.0)
    assert ctrl.window(1300.0, 10**6) == w0
    assert extra == 100  # two probes up (steps 0.1 and 0.025), one epoch each, both rejected


def test_the_climb_pauses_while_the_job_drains() -> None:
    ctrl, w0 = _climbing_controller()
    for i in range(400):
        t = 1000.0 + i
        w = ctrl.window(t, remaining=100)  # fewer left than the window: no probing
        ctrl.observe_load(snap(t, running=w, usage=w * 1800 / POOL, gen=1000 * i))
    assert ctrl.statistics().gain == 1.0  # no probe while the job drains


# --- invariants over random traces --------------------------------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("done"), st.integers(0, 20_000), st.integers(0, 20_000), st.floats(0, 5000)),
        st.tuples(st.just("load"), st.integers(0, 5000), st.integers(0, 5000), st.floats(0, 1),
                  st.integers(0, 50)),
        st.tuples(st.just("capacity"), st.integers(0, 2_000_000), st.one_of(st.none(), st.integers(1, 4096))),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(trace=events, f0=st.floats(1, 50_000), pool=st.integers(0, 2_000_000),
       min_window=st.integers(1, 8), max_window=st.integers(8, 4096))
def test_window_stays_in_bounds_on_random_traces(trace, f0, pool, min_window, max_window) -> None:
    cfg = ControllerConfig(min_window=min_window, max_window=max_window)
    ctrl = Controller(Capacity(pool, None), initial_tokens_per_request=f0, config=cfg)
    t, retractions = 0.0, 0
    for event in trace:
        t += 1.0
        retractions = 0 if event[0] == "capacity" else retractions + (event[4] if event[0] == "load" else 0)
        _apply(ctrl, t, event, retractions, gen=int(t * 100))
        assert min_window <= ctrl.window(t, 10**9) <= max_window
        assert ctrl.window(t, 3) <= 3


def _apply(ctrl: Controller, t: float, event: tuple, retractions: int, gen: int | None = None) -> None:
    """One `events` item: a completion, a load poll (`retractions` so far) or a new capacity."""
    if event[0] == "done":
        ctrl.observe_completion(t, event[1], event[2], event[3])
    elif event[0] == "load":
        ctrl.observe_load(LoadSnapshot(t, event[1], event[2], token_usage=event[3], retractions_total=retractions,
                                       gen_tokens_total=gen))
    else:
        ctrl.update_capacity(Capacity(event[1], event[2]))


polls = st.lists(
    st.one_of(
        st.tuples(st.just("load"), st.integers(0, 3000), st.integers(0, 3000), st.floats(0, 1),
                  st.one_of(st.none(), st.floats(0.01, 1.0)), st.integers(0, 12),
                  st.one_of(st.none(), st.integers(0, 7000))),
        st.tuples(st.just("done"), st.integers(1, 5000), st.integers(1, 5000)),
        st.tuples(st.just("restart"),),
    ),
    min_size=1, max_size=60,
)


def test_a_dip_in_running_after_a_wave_of_finishes_keeps_the_queue() -> None:
    """The window follows the peak running of the last running_peak_s, not a dip after a wave of finishes
    (SGLang's next admission round would find an empty queue)."""
    ctrl = Controller(Capacity(60_000, 3750), initial_tokens_per_request=2448)
    for t, (running, queued, ratio) in enumerate([(16, 8, 0.7), (44, 27, 0.098), (44, 22, 0.098), (30, 14, 0.098)]):
        ctrl.observe_load(_ratio_snap(float(t), running, queued, ratio, usage=0.7))
    assert not ctrl.warming
    assert ctrl.window(3.0, 300) == 44 + 22  # not 30 + 15: 14 queued, SGLang is about to admit them
    assert ctrl.queue_bound() == 14 + 22
    ctrl.observe_load(_ratio_snap(4.0 + CFG.running_peak_s, 30, 0, 0.098, usage=0.7))  # the peak has aged out
    assert ctrl.window(4.0 + CFG.running_peak_s, 300) == 30 + 15


@settings(max_examples=200, deadline=None)
@given(trace=polls, f0=st.floats(100, 20_000), pool=st.integers(1000, 1_000_000))
def test_the_servers_queue_stays_bounded_and_fed(trace, f0, pool) -> None:
    """After a poll showing `running` (T in transit), R the peak running within running_peak_s: at most
    R - running + max(queue_min, R / 2) queued at the server (2 R while SGLang warms up), and while the pool has
    room and no retraction cooldown holds, at least queue_min: the client never leaves SGLang nothing to admit."""
    ctrl = Controller(Capacity(pool, None), initial_tokens_per_request=f0)
    t, retractions, cool_until = 0.0, 0, -1.0
    seen: list[tuple[float, int]] = []
    for event in trace:
        t += 1.0
        if event[0] == "done":
            ctrl.observe_completion(t, event[1], event[2], latency_s=10.0)
            continue
        if event[0] == "restart":
            ctrl.update_capacity(Capacity(pool, None))
            retractions, cool_until, seen = 0, -1.0, []
            continue
        _, running, queued, usage, ratio, retracted, in_flight = event
        seen.append((t, running))
        peak = max(n for s, n in seen if s >= t - CFG.running_peak_s)
        transit = 0 if in_flight is None else max(0, in_flight - running - queued)
        retractions += retracted
        if retracted >= max(CFG.retraction_burst_min, CFG.retraction_burst_frac * running):
            cool_until = t + CFG.retraction_cooldown_s
        ctrl.observe_load(LoadSnapshot(t, running, queued, token_usage=usage, retractions_total=retractions,
                                       new_token_ratio=ratio), in_flight=in_flight)
        w = ctrl.window(t, 10**9)
        allowed = min(CFG.queue_max, max(CFG.queue_min, 2 * peak if ctrl.warming else peak // 2))
        assert w - running - transit <= peak - running + allowed  # what can queue at the server
        pool_has_room = usage < CFG.guard_usage_frac * CFG.target_usage
        if pool_has_room and t >= cool_until and running + transit + CFG.queue_min <= CFG.max_window:
            assert w >= running + transit + CFG.queue_min


@settings(max_examples=100, deadline=None)
@given(before=events, after=events, burst=st.integers(4, 500))
def test_no_growth_within_the_cooldown_after_any_burst(before, after, burst) -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=3000)
    t = 0.0
    for event in before:
        t += 0.1
        if event[0] == "done":
            ctrl.observe_completion(t, event[1], event[2], event[3])
    ctrl.observe_load(LoadSnapshot(t + 0.1, running=50, queued=0, token_usage=0.99, retractions_total=0))
    ctrl.observe_load(LoadSnapshot(t + 0.2, running=50, queued=0, token_usage=0.99, retractions_total=burst))
    t += 0.2
    ceiling = ctrl.window(t, 10**9)
    for event in after:  # anything but a new server, within the 30 s cooldown
        t += 0.3
        if event[0] != "capacity":
            _apply(ctrl, t, event, burst + (event[4] if event[0] == "load" else 0))
        assert ctrl.window(t, 10**9) <= ceiling


# --- latency-gradient mode ------------------------------------------------------------------------

def tpot_s(in_flight: int) -> float:
    """A server whose batch runs 120 requests; beyond that, requests wait and retractions set in."""
    if in_flight <= 120:
        return 0.02 * (1 + in_flight / 100)
    return 0.02 * 2.2 * (in_flight / 120) ** 1.4  # goodput in_flight / tpot falls past 120


def run_closed_loop(ctrl: Controller, seconds: float, tokens: int = 200) -> list[int]:
    """Keep `window` requests in flight; each takes tokens * tpot(in-flight at its start) seconds."""
    heap: list[tuple[float, float]] = []  # (finish_s, start_s)
    t, windows = 0.0, []
    while t < seconds:
        w = ctrl.window(t, 10**9)
        while len(heap) < w:
            heapq.heappush(heap, (t + tokens * tpot_s(len(heap) + 1), t))
        finish, start = heapq.heappop(heap)
        t = finish
        ctrl.observe_completion(t, 300, tokens, latency_s=finish - start)
        windows.append(w)
    return windows


def test_gradient_mode_converges_on_a_tpot_curve() -> None:
    ctrl = Controller(Capacity(0, None), initial_tokens_per_request=1000)
    assert ctrl.window(0.0, 10**6) == 32 + 2
    assert ctrl.statistics().mode == "gradient"
    windows = run_closed_loop(ctrl, seconds=3000)
    final = windows[-1]
    assert 95 <= final <= 140, final  # goodput peaks at 120 in flight
    assert all(95 <= w <= 160 for w in windows[len(windows) * 3 // 4:])


def test_update_capacity_switches_modes() -> None:
    ctrl = Controller(Capacity(0, None), initial_tokens_per_request=4000)
    assert ctrl.statistics().mode == "gradient"
    ctrl.update_capacity(Capacity(POOL, None, source="server_info"))
    assert ctrl.statistics().mode == "model"
    assert ctrl.window(0.0, 10**6) == 90
    ctrl.observe_load(snap(1.0, running=10))
    assert ctrl.statistics().mode == "load"


def test_goodput_is_the_live_decode_rate_when_the_server_reports_it() -> None:
    ctrl, w0 = _climbing_controller()
    for i in range(51):  # one epoch is 50 s (half the 100 s latency); the last poll concludes it
        t = 1000.0 + i
        w = ctrl.window(t, 10**6)
        ctrl.observe_load(LoadSnapshot(t, running=w, queued=0, used_tokens=w * 1800, token_usage=w * 1800 / POOL,
                                       retractions_total=_baseline(i), gen_tokens_total=None,
                                       gen_throughput=10.0 * w))
    stats = ctrl.statistics()
    assert stats.goodput_tok_s == 10.0 * w0
    assert stats.reason == f"{10 * w0} tok/s: measured reference, probe up"
    assert ctrl.window(1051.0, 10**6) == model_window(POOL, 2000, gain=1.1)
