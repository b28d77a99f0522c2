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
    """One load poll per second; gen_tokens_total grows at goodput_of_window(window). Returns windows.

    Running requests hold 1800 tokens each (a little under the 2000 learned from completions).
    """
    rng = random.Random(seed)
    gen, windows = 0, []
    for i in range(seconds):
        t = t0_s + i
        w = ctrl.window(t, remaining=10**9)
        windows.append(w)
        gen += int(goodput_of_window(w) * (1 + rng.uniform(-noise, noise)))
        ctrl.observe_load(snap(t, running=w - 2, queued=0, usage=(w - 2) * 1800 / POOL, gen=gen))
        if i % 5 == 0:  # completions keep the latency estimate (100 s) and the sizes steady
            ctrl.observe_completion(t, 1000, 2000, latency_s=100.0)
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
    # An idle pool does not push past the server's running cap.
    for t in range(1, 30):
        ctrl.observe_load(snap(float(t), running=66, queued=0, usage=0.1))
    assert ctrl.window(30.0, 10**6) == 64 + 3


@pytest.mark.parametrize(("remaining", "expected"), [(0, 0), (1, 1), (7, 7), (89, 89), (10**6, 90)])
def test_never_exceeds_remaining(remaining: int, expected: int) -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=4000)
    assert ctrl.window(0.0, remaining) == expected


# --- live load -----------------------------------------------------------------------------------

def test_grows_to_fill_an_idle_pool() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 200, 1000, 2000)  # held = 2000 = the prior: the model alone would not move; first wave done
    w0 = ctrl.window(0.0, 10**6)
    assert w0 == model_window(POOL, 2000)
    windows = []
    for t in range(1, 6):  # e.g. shared prefixes: the pool sits at 20% with everything running
        ctrl.observe_load(snap(float(t), running=ctrl.window(t, 10**6), queued=0, usage=0.2,
                               gen=1000 * t))
        windows.append(ctrl.window(float(t), 10**6))
    # live KV per running request (0.2 * C / running) is below the estimate, so the model holds;
    # the idle rule multiplies the gain by 1.1 per poll.
    assert windows == [model_window(POOL, 2000, gain=1.1 ** k) for k in range(1, 6)]
    assert ctrl.statistics().reason == "pool idle (usage 20%, nothing queued): grow"


def test_shrinks_to_running_plus_slack_when_the_queue_builds() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=4000)
    assert ctrl.window(0.0, 10**6) == 90
    ctrl.observe_load(snap(1.0, running=60, queued=30, usage=0.6))  # 3760 tokens per running request
    assert ctrl.window(1.0, 10**6) == 90  # one poll could be prefill still admitting
    ctrl.observe_load(snap(2.0, running=60, queued=30, usage=0.6))
    assert ctrl.window(2.0, 10**6) == 60 + 4
    stats = ctrl.statistics()
    assert (stats.window, stats.mode, stats.running, stats.queued, stats.token_usage) == (64, "load", 60, 30, 0.6)
    assert ctrl.statistics().reason == "queue building (30 queued, running flat at 60): window = running + 4"
    # The queue drains: the cap lifts by one slack per poll back to the model's window.
    lifted = []
    for t in range(3, 12):
        ctrl.observe_load(snap(float(t), running=63, queued=0, usage=0.6))
        lifted.append(ctrl.window(float(t), 10**6))
    assert lifted == [68, 72, 76, 80, 84, 88, 90, 90, 90]


def test_queue_while_running_still_rises_is_not_a_build_up() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=4000)
    ctrl.observe_load(snap(1.0, running=30, queued=60, usage=0.1))
    ctrl.observe_load(snap(2.0, running=55, queued=35, usage=0.2))  # prefill is admitting
    assert ctrl.window(2.0, 10**6) == 90


def test_never_grows_right_after_a_retraction_burst() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 100, 1000, 2000)
    ctrl.observe_load(snap(1.0, running=170, usage=0.9, retractions=10))
    ctrl.observe_load(snap(2.0, running=170, usage=0.9, retractions=20))  # +10 in one poll
    after = ctrl.window(2.0, 10**6)
    assert after == model_window(POOL, 2000, gain=0.9)
    assert ctrl.statistics().reason == "retraction burst (10 in one poll): step back, no growth for 30 s"
    # Idle pool and short completions right after: the window must not grow during the cooldown.
    for t in range(3, 32):
        ctrl.observe_load(snap(float(t), running=after, usage=0.1, retractions=20))
        warm_up(ctrl, 5, 100, 100, now_s=float(t))
        assert ctrl.window(float(t), 10**6) <= after
    ctrl.observe_load(snap(33.0, running=after, usage=0.1, retractions=20))
    assert ctrl.window(33.0, 10**6) > after  # cooldown over: short requests fit many more


def test_single_retractions_are_tolerated() -> None:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 100, 1000, 2000)
    w = ctrl.window(0.0, 10**6)
    for t in range(1, 10):  # one retraction per poll among 170 running is below the burst threshold
        ctrl.observe_load(snap(float(t), running=170, usage=0.9, retractions=t))
    assert ctrl.window(10.0, 10**6) == w


# --- hill climb on goodput ----------------------------------------------------------------------

def _climbing_controller() -> tuple[Controller, int]:
    ctrl = Controller(Capacity(POOL, None), initial_tokens_per_request=2000)
    warm_up(ctrl, 200, 1000, 2000)
    return ctrl, ctrl.window(999.0, 10**6)


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
    gen, retractions = 0, 0
    for i in range(300):
        t = 1000.0 + i
        w = ctrl.window(t, 10**6)
        gen += 10 * w  # goodput rises with the window (the counter does not see recompute) ...
        retractions += 1 if w > w0 else 0  # ... but every second retracts one request
        ctrl.observe_load(snap(t, running=w, usage=w * 1800 / POOL, retractions=retractions, gen=gen))
        if i % 5 == 0:
            ctrl.observe_completion(t, 1000, 2000, latency_s=100.0)
    assert ctrl.window(1300.0, 10**6) == w0
    assert retractions == 100  # two probes up (steps 0.1 and 0.025), one epoch each, both rejected


def test_the_climb_pauses_while_the_job_drains() -> None:
    ctrl, w0 = _climbing_controller()
    for i in range(400):
        t = 1000.0 + i
        w = ctrl.window(t, remaining=100)  # fewer left than the window: no probing
        ctrl.observe_load(snap(t, running=w, usage=0.5, gen=1000 * i))
    assert ctrl.window(1400.0, remaining=10**6) == w0


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
        if event[0] == "done":
            ctrl.observe_completion(t, event[1], event[2], event[3])
        elif event[0] == "load":
            retractions += event[4]
            ctrl.observe_load(LoadSnapshot(t, event[1], event[2], token_usage=event[3],
                                           retractions_total=retractions, gen_tokens_total=int(t * 100)))
        else:
            ctrl.update_capacity(Capacity(event[1], event[2]))
            retractions = 0
        assert min_window <= ctrl.window(t, 10**9) <= max_window
        assert ctrl.window(t, 3) <= 3


@settings(max_examples=100, deadline=None)
@given(before=events, after=events, burst=st.integers(2, 500))
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
        if event[0] == "done":
            ctrl.observe_completion(t, event[1], event[2], event[3])
        elif event[0] == "load":
            ctrl.observe_load(LoadSnapshot(t, event[1], event[2], token_usage=event[3],
                                           retractions_total=burst + event[4]))
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
                                       retractions_total=0, gen_tokens_total=None, gen_throughput=10.0 * w))
    stats = ctrl.statistics()
    assert stats.goodput_tok_s == 10.0 * w0
    assert stats.reason == f"{10 * w0} tok/s: measured reference, probe up"
    assert ctrl.window(1051.0, 10**6) == model_window(POOL, 2000, gain=1.1)
