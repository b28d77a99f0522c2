"""Capacity and load parsing from recorded SGLang / vLLM answers (httpx.MockTransport in-process,
tests/mock_http.py)."""

from contextlib import AbstractAsyncContextManager

import httpx
import pytest

from gen_pipeline.http import Http
from gen_pipeline.records import Capacity, LoadSnapshot
from gen_pipeline.server import load, read_load
from gen_pipeline.server.capacity import capacity_from_log, combine, probe

from mock_http import mock_http

SERVER_INFO_DP2 = {
    "model_path": "moonshotai/Kimi-K2.5", "tp_size": 8, "dp_size": 2, "kv_cache_dtype": "fp8_e4m3",
    "max_running_requests": None, "max_total_num_tokens": 188_000,
    "internal_states": [{"effective_max_running_requests_per_dp": 512, "last_gen_throughput": 700.0},
                        {"effective_max_running_requests_per_dp": 512, "last_gen_throughput": 650.0}],
    "version": "0.5.5",
}
LOADS_DP2 = {"timestamp": "t", "version": "0.5.5", "loads": [
    {"dp_rank": 0, "num_running_reqs": 40, "num_waiting_reqs": 3, "num_used_tokens": 90_000,
     "max_total_num_tokens": 188_000, "token_usage": 0.48, "gen_throughput": 700.0},
    {"dp_rank": 1, "num_running_reqs": 38, "num_waiting_reqs": 1, "num_used_tokens": 98_000,
     "max_total_num_tokens": 188_000, "token_usage": 0.52, "gen_throughput": 650.0}]}
METRICS_COLON = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="k"} 40.0
sglang:num_running_reqs{dp_rank="1",model_name="k"} 38.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="k"} 3.0
sglang:num_queue_reqs{dp_rank="1",model_name="k"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="k"} 0.4
sglang:token_usage{dp_rank="1",model_name="k"} 0.6
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{dp_rank="0",model_name="k"} 5.0
sglang:num_retracted_requests_total{dp_rank="1",model_name="k"} 2.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{dp_rank="0",model_name="k"} 1000.0
sglang:generation_tokens_total{dp_rank="1",model_name="k"} 500.0
"""
VLLM_METRICS = """# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="20000",cache_dtype="auto"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 12.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.75
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m",engine="0"} 9.0
"""


def client(routes: dict[str, object]) -> AbstractAsyncContextManager[Http]:
    """routes: "http://a/path" → dict (JSON) | str (text) ; anything else answers 404."""
    def handler(request: httpx.Request) -> httpx.Response:
        body = routes.get(str(request.url))
        if isinstance(body, dict):
            return httpx.Response(200, json=body)
        if isinstance(body, str):
            return httpx.Response(200, text=body)
        return httpx.Response(404, json={"detail": "Not Found"})
    return mock_http(handler)


@pytest.fixture(autouse=True)
def fresh_sources():
    load._KNOWN.clear()  # which load endpoints each URL answers is remembered for the process's life
    yield
    load._KNOWN.clear()


OLD_INFO = {"max_total_num_tokens": 24_576, "max_running_requests": 64, "internal_states": [{}]}
# --dcp-size d: SGLang 0.5.17 reports one rank's pool; each rank holds 1/d of every token, the scheduler admits d x
DCP_INFO = {**SERVER_INFO_DP2, "dp_size": 1, "internal_states": [{"effective_max_running_requests_per_dp": 512}],
            "dcp_size": 4}


@pytest.mark.parametrize("routes, expected", [
    ({"http://a/server_info": SERVER_INFO_DP2}, Capacity(376_000, 1024, servers=1, source="server_info")),
    # a (the old endpoint) has no per-dp effective value: the CLI max_running_requests is used
    ({"http://a/get_server_info": OLD_INFO, "http://b/server_info": SERVER_INFO_DP2},
     Capacity(24_576 + 376_000, 64 + 1024, servers=2, source="server_info")),
    ({"http://a/v1/loads": LOADS_DP2}, Capacity(376_000, None, servers=1, source="loads")),
    ({"http://a/metrics": VLLM_METRICS}, Capacity(320_000, None, servers=1, source="vllm_metrics")),
    ({}, Capacity(0, None, servers=1, source="unknown")),
    ({"http://a/server_info": DCP_INFO}, Capacity(4 * 188_000, 512, servers=1, source="server_info")),
], ids=["server_info", "old-endpoint-and-two", "loads", "vllm", "unknown", "dcp"])
async def test_capacity_sums_dp_ranks_and_servers_and_falls_back(routes: dict, expected: Capacity):
    urls = sorted({url.rpartition("/")[0].removesuffix("/v1") for url in routes}) or ["http://a"]
    async with client(routes) as http:  # what attach mode computes: each server probed, the capacities summed
        assert combine([(await probe(http, url))[0] for url in urls]) == expected


def test_capacity_from_log_line():
    lines = ["[2026-01-01 TP0] Load weight end.",
             "[2026-01-01 TP0] max_total_num_tokens=376000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=1024, context_len=262144, available_gpu_mem=3.5 GB"]
    assert capacity_from_log(lines) == (376_000, 1024)
    assert capacity_from_log(["nothing here"]) is None


@pytest.mark.parametrize("routes, expected", [
    ({"http://a/v1/loads": LOADS_DP2}, LoadSnapshot(  # dp ranks summed
        t_s=1.0, running=78, queued=4, used_tokens=188_000, token_usage=0.5, gen_throughput=1350.0)),
    ({"http://a/v1/loads": LOADS_DP2, "http://a/metrics": METRICS_COLON}, LoadSnapshot(  # counters from /metrics
        t_s=1.0, running=78, queued=4, used_tokens=188_000, token_usage=0.5, retractions_total=7,
        gen_tokens_total=1500, gen_throughput=1350.0)),
    *[({"http://a/metrics": text}, LoadSnapshot(t_s=1.0, running=78, queued=4, used_tokens=None, token_usage=0.5,
                                                retractions_total=7, gen_tokens_total=1500, gen_throughput=None))
      for text in (METRICS_COLON, METRICS_COLON.replace("sglang:", "sglang_"))],  # either spelling
    ({"http://v/metrics": VLLM_METRICS, "http://a/v1/loads": LOADS_DP2}, LoadSnapshot(  # vLLM + SGLang: summed
        t_s=1.0, running=90, queued=8, used_tokens=None, token_usage=(0.75 + 0.5) / 2)),
], ids=["loads", "loads-and-metrics", "metrics", "metrics-underscore", "vllm-and-sglang"])
async def test_load_from_loads_metrics_and_several_servers(routes: dict, expected: LoadSnapshot):
    urls = list(dict.fromkeys(url.rpartition("/")[0].removesuffix("/v1") for url in routes))
    async with client(routes) as http:
        assert await read_load(http, urls, now_s=1.0) == expected


async def test_load_none_when_not_exposed_and_remembers_sources():
    calls = []
    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(200, json=LOADS_DP2) if request.url.path == "/v1/loads" else httpx.Response(404)
    async with mock_http(handler) as http:
        assert await read_load(http, ["http://n"], now_s=0) is not None
        assert await read_load(http, ["http://n"], now_s=1) is not None
    assert calls == ["/v1/loads", "/metrics", "/v1/loads"]  # /metrics written off after the first poll
    async with client({}) as http:
        assert await read_load(http, ["http://none"], now_s=0) is None

