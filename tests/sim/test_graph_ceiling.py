"""The simulator's CUDA-graph ceiling: SGLang's default cuda_graph_max_bs, a slower decode step above
it, the field in /server_info, the decode log line's flag and the metrics, all in-process."""

from __future__ import annotations

import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_sim.app import SimServer, build_app
from sglang_sim.cli import parse_args
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.loop import build_engine
from sglang_sim.profiles import NO_GRAPH_STEP_FACTOR, default_cuda_graph_max_bs, get_profile


@pytest.mark.parametrize(("gpu_mem_gb", "tp_size", "expected"), [
    (141, 1, 256),  # one H200: SGLang 0.5.17 server_args.py, "H20, H200" branch, tp < 4
    (141, 8, 512),  # the 8-GPU node
    (80, 1, 256), (80, 4, 512),  # H100 80GB
    (95.6, 8, 512),  # the reference node's RTX PRO 6000 (96 GB)
    (40, 1, 32), (24, 1, 24), (24, 4, 80), (16, 1, 8), (192, 8, 512),
])
def test_default_ceiling_follows_sglang_rule(gpu_mem_gb: float, tp_size: int, expected: int) -> None:
    assert default_cuda_graph_max_bs(gpu_mem_gb, tp_size) == expected


def _decode_steps(ceiling: int | None, requests: int) -> list[tuple[int, float, bool]]:
    engine = Engine(EngineConfig(max_total_num_tokens=200_000, context_length=4096, cuda_graph_max_bs=ceiling),
                    get_profile("h200"))
    for i in range(requests):
        engine.add_request(f"r{i}", list(range(100)), list(range(50)), "stop", max_new_tokens=512)
    steps = []
    while not engine.idle:
        result = engine.step()
        if result.decode_batch:
            steps.append((result.decode_batch, result.dt_s, result.cuda_graph))
    return steps


def test_decode_step_above_the_ceiling_is_slower_at_the_same_batch(capsys) -> None:
    graphed, eager = _decode_steps(None, 300), _decode_steps(256, 300)
    assert [b for b, _, _ in graphed] == [b for b, _, _ in eager] == [300] * 50
    assert all(g for _, _, g in graphed) and not any(g for _, _, g in eager)
    assert eager[0][1] == pytest.approx(NO_GRAPH_STEP_FACTOR * graphed[0][1])
    # at or below the ceiling nothing changes
    assert _decode_steps(256, 256) == _decode_steps(None, 256)
    # --sim-no-graph-factor sets the eager step's cost; below 1 it is refused
    engine, _ = build_engine(parse_args(["--sim-profile", "h200", "--sim-no-graph-factor", "4"]))
    assert engine.profile.no_graph_step_factor == 4.0
    assert build_engine(parse_args(["--sim-profile", "h200"]))[0].profile.no_graph_step_factor == NO_GRAPH_STEP_FACTOR
    with pytest.raises(SystemExit) as e:
        parse_args(["--sim-no-graph-factor", "0.5"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("error: --sim-no-graph-factor must be >= 1 (got 0.5)\n")


def _sim(*flags: str) -> SimServer:
    ns = parse_args(["--sim-profile", "h200", "--max-total-tokens", "120000", "--enable-metrics", *flags])
    engine, info = build_engine(ns)
    return SimServer(ns, engine, info)


async def _get(sim: SimServer, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(sim)), base_url="http://sim") as c:
        return await c.get(path)


@pytest.mark.parametrize(("flags", "decode"), [
    ((), {"backend": "full", "max_bs": 256}),
    (("--cuda-graph-max-bs", "320"), {"backend": "full", "max_bs": 320}),
    (("--tp-size", "8"), {"backend": "full", "max_bs": 512}),
    (("--disable-cuda-graph",), {"backend": "disabled", "max_bs": None}),
])
async def test_server_info_has_the_resolved_cuda_graph_config(flags: tuple[str, ...], decode: dict) -> None:
    body = (await _get(_sim(*flags), "/server_info")).json()
    got = body["cuda_graph_config"]["decode"]
    assert {k: got[k] for k in decode} == decode
    if decode["max_bs"]:
        assert got["bs"][-1] == decode["max_bs"] and got["bs"][:6] == [1, 2, 4, 8, 12, 16]


async def test_metrics_and_log_line_say_when_the_decode_ran_without_a_graph(
        caplog: pytest.LogCaptureFixture) -> None:
    sim = _sim("--decode-log-interval", "1")
    for i in range(300):
        # outputs of 200 tokens: none finishes while the others are still being admitted
        sim.loop.engine.add_request(f"r{i}", list(range(100)), list(range(200)), "stop", max_new_tokens=200)
    with caplog.at_level(logging.INFO, logger="sglang_sim"):
        for _ in range(400):  # steps until all 300 run and a step decodes them (a bound, not a wait)
            if sim.loop.engine.step().decode_batch and sim.loop.engine.num_running == 300:
                break
        assert sim.loop.engine.num_running == 300
        result = sim.loop.engine.step()
        sim.loop._log_step(result, sim.loop.engine.new_token_ratio)
    decode_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Decode batch")]
    assert decode_lines[-1].startswith("Decode batch, #running-req: 300, #token: ")
    assert ", cuda graph: False, gen throughput (token/s): " in decode_lines[-1]
    text = (await _get(sim, "/metrics")).text
    samples = {(s.name, s.labels.get("mode")): s.value for f in text_string_to_metric_families(text)
               for s in f.samples}
    assert samples[("sglang:is_cuda_graph", None)] == 0.0
    assert samples[("sglang:cuda_graph_passes_total", "decode_none")] >= 1.0
    assert ("sglang:cuda_graph_passes_total", "decode_cuda_graph") not in samples
