"""The controller and SGLang's CUDA-graph ceiling: read from /server_info (or a knee in the decode rate), requests
in flight held at or below it, goodput moving the cap both ways."""

from __future__ import annotations

import pytest

from gen_pipeline.controller import Controller
from gen_pipeline.records import Capacity, LoadSnapshot
from gen_pipeline.server.capacity import capacity_from_server_info, combine

INFO = {"max_total_num_tokens": 120_000, "internal_states": [{"effective_max_running_requests_per_dp": 4096}]}


@pytest.mark.parametrize(("extra", "ceiling"), [
    ({"cuda_graph_config": {"decode": {"backend": "full", "max_bs": 256, "bs": [1, 2, 4]}}}, 256),  # SGLang 0.5.17
    ({"cuda_graph_config": {"decode": {"backend": "disabled", "max_bs": 256}}}, None),  # graphs off: no ceiling
    ({"cuda_graph_max_bs": 160}, 160),  # older SGLang: a flat server arg
    ({"cuda_graph_max_bs": 160, "disable_cuda_graph": True}, None),
    ({}, None),
])
def test_capacity_reads_the_graph_ceiling(extra: dict, ceiling: int | None) -> None:
    cap = capacity_from_server_info(INFO | extra)
    assert cap is not None and cap.cuda_graph_max_bs == ceiling


def test_ceiling_sums_over_dp_ranks_and_servers() -> None:
    two_ranks = INFO | {"internal_states": [{}, {}], "cuda_graph_max_bs": 256}
    one = capacity_from_server_info(INFO | {"cuda_graph_max_bs": 256})
    assert capacity_from_server_info(two_ranks).cuda_graph_max_bs == 512  # type: ignore[union-attr]
    assert combine([one, one]).cuda_graph_max_bs == 512
    assert combine([one, capacity_from_server_info(INFO)]).cuda_graph_max_bs is None  # one unknown: unknown


def _rate(running: int, ceiling: int = 256) -> float:
    """~60 tok/s per request with graphs, less than half past the ceiling (an H100)."""
    return 60.0 * running if running <= ceiling else 27.0 * running


def drive(ctl: Controller, seconds: int, remaining: int = 100_000) -> list[tuple[int, int]]:
    """A server that runs every request in flight (short prompts, a roomy pool) at _rate; completions at
    running / 10 per second, each 200 + 255 tokens after 10 s. Returns (second, window) pairs."""
    out, done = [], 0.0
    for t in range(1, seconds + 1):
        window = ctl.window(float(t), remaining)
        out.append((t, window))
        running = window
        ctl.observe_load(LoadSnapshot(float(t), running, 0, token_usage=0.6, gen_throughput=_rate(running),
                                      new_token_ratio=0.1), in_flight=window)
        done += running / 10
        while done >= 1:
            done -= 1
            ctl.observe_completion(float(t), 200, 255, 10.0)
    return out


@pytest.mark.parametrize("ceiling", [256, 128])
def test_window_never_exceeds_the_ceiling(ceiling: int) -> None:
    ctl = Controller(Capacity(120_000, 4096, cuda_graph_max_bs=ceiling), initial_tokens_per_request=350)
    assert ctl.window(0.0, 3000) == ceiling  # the pool's model alone would send ~300
    assert "at most" in ctl.statistics().reason and f"CUDA-graph ceiling ({ceiling})" in ctl.statistics().reason
    windows = [w for _, w in drive(ctl, 400)]
    assert max(windows) == ceiling and windows[-1] == ceiling


def test_the_cap_probes_down_and_comes_back_when_goodput_falls() -> None:
    ctl = Controller(Capacity(120_000, 4096, cuda_graph_max_bs=256), initial_tokens_per_request=350)
    windows = [w for _, w in drive(ctl, 600)]
    below = [w for w in windows if w < 256]
    assert below and min(below) >= 243  # probes of 5 % and 2.5 % below the ceiling, never far
    assert windows[-1] == 256 and max(windows) == 256


def test_without_the_field_a_knee_in_the_decode_rate_caps_the_batch() -> None:
    ctl = Controller(Capacity(120_000, 4096), initial_tokens_per_request=350)
    assert ctl.window(0.0, 3000) > 256  # nothing known: the pool's model
    # the first polls: SGLang's batch at 224-255 (graphs), then 288-319 (none): the rate falls
    for t, running in enumerate([230] * 5 + [300] * 5, start=1):
        ctl.observe_load(LoadSnapshot(float(t), running, 50, token_usage=0.6, gen_throughput=_rate(running)),
                         in_flight=running + 50)
    assert ctl.statistics().reason == ("batch ceiling at 239: decode rate fell 41% above 239 running "
                                       "(13,800 -> 8,100 tok/s at 288+)")
    assert ctl.window(11.0, 3000) == 239
    windows = [w for _, w in drive(ctl, 600)]
    # goodput decides from there: it may probe up to 1.5 x the knee, but falls past 256 and comes back
    assert max(windows) <= 1.5 * 239 and windows[-1] <= 256


def test_long_regime_below_the_ceiling_is_untouched() -> None:
    """KV-bound long outputs run ~40 requests: the ceiling never binds and the feed is as before."""
    with_field = Controller(Capacity(60_000, 4096, cuda_graph_max_bs=256), initial_tokens_per_request=1600)
    without = Controller(Capacity(60_000, 4096), initial_tokens_per_request=1600)
    for ctl in (with_field, without):
        for t in range(1, 200):
            ctl.observe_load(LoadSnapshot(float(t), 38, 20, token_usage=0.68, gen_throughput=38 * 60.0,
                                          new_token_ratio=0.1), in_flight=58)
            if t % 2 == 0:
                ctl.observe_completion(float(t), 400, 1300, 45.0)
    assert with_field.window(200.0, 900) == without.window(200.0, 900)
