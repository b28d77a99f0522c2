"""The retraction signal on every SGLang version's /metrics: the counter where served, else a
tally of the per-window gauge `sglang:num_retracted_reqs` (SGLang 0.5.x); and end to end, a
KV-starved simulator seen through the real poller by the real controller."""

from __future__ import annotations

import anyio
import httpx
import pytest
from servers import sim_in_thread

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.controller import Controller, ControllerConfig
from gen_pipeline.http import open_http
from gen_pipeline.records import Capacity
from gen_pipeline.server import load, read_load
from gen_pipeline.server.load import RetractionTally, load_from_metrics

_BASE = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0"} 10.0
sglang:num_running_reqs{dp_rank="1"} 10.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0"} 0.0
sglang:num_queue_reqs{dp_rank="1"} 0.0
"""


def _gauge(r0: float, r1: float) -> str:
    return (_BASE + "# TYPE sglang:num_retracted_reqs gauge\n"
            f'sglang:num_retracted_reqs{{dp_rank="0"}} {r0}\nsglang:num_retracted_reqs{{dp_rank="1"}} {r1}\n')


def _counter(r0: float, r1: float) -> str:
    return ("# TYPE sglang:num_retracted_requests_total counter\n"
            f'sglang:num_retracted_requests_total{{dp_rank="0"}} {r0}\n'
            f'sglang:num_retracted_requests_total{{dp_rank="1"}} {r1}\n')


def _totals(texts: list[str]) -> list[int | None]:
    tally = RetractionTally()
    return [load_from_metrics(t, float(i), tally).retractions_total for i, t in enumerate(texts)]


@pytest.mark.parametrize("polls, expected", [
    # SGLang 0.5.4: only the gauge, tallied per rank. A window held over two polls counts once; 0 -> 3 again is new.
    ([_gauge(0, 0), _gauge(3, 0), _gauge(3, 2), _gauge(0, 2), _gauge(3, 0), _gauge(0, 0)], [0, 3, 5, 5, 8, 8]),
    # SGLang 0.5.17: the labelled counter is absent until the first retraction, the gauge shows it later: the
    # counter takes over without counting twice
    ([_gauge(0, 0), _gauge(0, 0) + _counter(4, 0), _gauge(4, 0) + _counter(4, 0), _gauge(0, 0) + _counter(4, 1),
      _gauge(0, 1) + _counter(4, 1)], [0, 4, 4, 5, 5]),
    # 0.4.7-0.4.10's cumulative gauge, then no signal at all
    ([_BASE + '# TYPE sglang:total_retracted_reqs gauge\nsglang:total_retracted_reqs{dp_rank="0"} 6.0\n', _BASE],
     [6, None]),
], ids=["gauge", "counter-appears", "old-gauge"])
def test_the_retraction_count_on_every_sglang_version(polls: list[str], expected: list[int | None]) -> None:
    assert _totals(polls) == expected


SIM = ["--max-total-tokens", "3000", "--enable-metrics", "--time-scale", "1", "--sim-output-mean", "300",
       "--sim-output-spread", "0.1", "--schedule-conservativeness", "0.3", "--log-level", "warning"]


async def _flood(http: httpx.AsyncClient, url: str, n: int) -> None:
    async def one(i: int) -> None:
        body = {"text": f"request {i} " + "word " * 40, "sampling_params": {"max_new_tokens": 400}}
        (await http.post(url + "/generate", json=body, timeout=120)).raise_for_status()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)


async def test_controller_sees_retractions_of_a_kv_starved_sim():
    load._KNOWN.clear()  # which load endpoints each URL answers is remembered for the process's life
    # the signal path, not the threshold: here any retraction in a poll is a burst (the default is 4)
    ctrl = Controller(Capacity(max_total_num_tokens=3000, max_running_requests=None, source="server_info"),
                      initial_tokens_per_request=100.0, config=ControllerConfig(retraction_burst_min=1))
    reasons = set()
    with sim_in_thread(SIM) as sim:
        async with httpx.AsyncClient() as http, open_http(GenerationConfig(), 16) as session:  # ours
            async with anyio.create_task_group() as tg:
                async def poll() -> None:  # the pipeline's cadence: retractions add up between polls
                    t = 0.0
                    while True:
                        ctrl.observe_load(await read_load(session, [sim.url], now_s=t))
                        reasons.add(ctrl.statistics().reason)
                        t += 0.25
                        await anyio.sleep(0.25)
                tg.start_soon(poll)
                await _flood(http, sim.url, 40)
                tg.cancel_scope.cancel()
            # one poll after the flood: a retraction in its last quarter second is seen as a burst too
            ctrl.observe_load(await read_load(session, [sim.url], now_s=1e6))
            reasons.add(ctrl.statistics().reason)
            truth = (await http.get(sim.url + "/sim/stats")).json()["counters"]["num_retracted_requests_total"]
    assert truth > 0
    assert ctrl.statistics().retractions == truth  # the 0.5.17 counter, read through the poller
    assert any(r.startswith("retraction burst") for r in reasons), reasons


def test_the_gauge_alone_of_a_kv_starved_sim_tallies_its_retractions():
    """A 0.5.4-shaped /metrics (the counter's lines removed): the gauge's tally sees retractions, never too many.
    The simulator's own /metrics text read after every scheduler step, stepped here (no clock): a scrape
    over HTTP can miss a gauge window (it lasts until the next stats log) when the machine is loaded."""
    from sglang_sim.app import SimServer
    from sglang_sim.cli import parse_args
    from sglang_sim.loop import build_engine
    from sglang_sim.metrics import render

    ns = parse_args(SIM)
    engine, info = build_engine(ns)
    sim = SimServer(ns, engine, info)
    for i in range(40):  # what _flood sends: a ~45-token prompt, ~300 tokens out (spread 0.1), 400 at most
        engine.add_request(f"r{i}", [1 + (i + k) % 90 for k in range(45)], [5] * (270 + (i * 7) % 60),
                           max_new_tokens=400)
    texts = []
    while not engine.idle:
        engine.step()
        texts.append(render(sim.registry).decode())
    truth = engine.counters()["num_retracted_requests_total"]
    assert truth > 0 and len(texts) > 40  # several stats windows, some of them with retractions
    gauge_only = ["\n".join(ln for ln in t.splitlines() if "num_retracted_requests" not in ln) for t in texts]
    assert _totals(texts)[-1] == truth  # the counter, where served, is the truth
    assert 0 < _totals(gauge_only)[-1] <= truth


def test_split_counters_are_added_and_tp_repeats_are_not():
    text = (_BASE + "# TYPE sglang:generation_tokens_total counter\n"
            'sglang:generation_tokens_total{model_name="m",is_streaming="false"} 100.0\n'
            'sglang:generation_tokens_total{model_name="m",is_streaming="true"} 40.0\n'
            "# TYPE sglang:num_used_tokens gauge\n"
            'sglang:num_used_tokens{dp_rank="0",tp_rank="0"} 500.0\n'
            'sglang:num_used_tokens{dp_rank="0",tp_rank="1"} 500.0\n'
            'sglang:num_used_tokens{dp_rank="1",tp_rank="0"} 300.0\n')
    snap = load_from_metrics(text, 0.0)
    assert (snap.gen_tokens_total, snap.used_tokens) == (140, 800)
