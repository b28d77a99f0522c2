"""run_attached: a running sim, an sglang-router in front of sims, and URLs that are not SGLang."""

from __future__ import annotations

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from gen_pipeline.errors import ServerError
from gen_pipeline.records import Capacity
from gen_pipeline.server import read_load, run_attached
from sglang_sim.testing import free_port, start_sim

from server_helpers import router, started

SIM = ["--max-total-tokens", "20000", "--enable-metrics", "--time-scale", "20"]


@pytest.fixture(scope="module")
def sims():
    with start_sim(SIM, ready_timeout_s=20) as a, start_sim(SIM, ready_timeout_s=20) as b:
        yield a, b


async def test_attach_to_a_running_sim(http, sims, events):
    async with started(run_attached, [sims[0].url], http=http, health_interval_s=0.2) as handle:
        assert handle.base_urls == [sims[0].url]
        assert handle.model == "sim/Kimi-K2.5"
        assert handle.capacity.max_total_num_tokens == 20_000 and handle.capacity.source == "server_info"
        assert handle.metrics and handle.pid is None and handle.log_path is None
        snap = await read_load(http, handle.base_urls, now_s=1.0)
        assert (snap.running, snap.queued, snap.retractions_total) == (0, 0, 0)
        await handle.wait_ready()
    assert events == [f"attached to {sims[0].url}: {handle.summary_line()}"]


async def test_attach_to_several_servers_sums_capacity(http, sims):
    async with started(run_attached, [s.url for s in sims], http=http) as handle:
        assert handle.capacity.max_total_num_tokens == 40_000 and handle.capacity.servers == 2
        assert handle.summary_line().startswith("2 servers: ")


async def test_attach_to_a_non_sglang_server_says_what_answered(http):
    app = Starlette(routes=[Route("/{path:path}", lambda request: HTMLResponse("<html><h1>Welcome</h1></html>"))])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.02)
        with pytest.raises(ServerError) as e:
            await run_attached([f"http://127.0.0.1:{port}"], http=http)
        server.should_exit = True
    assert str(e.value) == (
        f"http://127.0.0.1:{port} does not look like an SGLang or OpenAI-compatible server: GET /v1/models "
        "answered 200 (text/html; charset=utf-8): '<html><h1>Welcome</h1></html>'. Set SERVER_URL to the "
        "server's base URL (e.g. http://host:30000, without /v1).")


@pytest.mark.e2e  # the process is the subject: make e2e
async def test_attach_through_sglang_router(http, sims, tmp_path):
    with router(list(sims), tmp_path, on_failure=pytest.skip) as url:
        async with started(run_attached, [url], http=http) as handle:
            assert handle.base_urls == [url] and handle.model == "sim/Kimi-K2.5"
            # the CUDA-graph ceiling of the router's two servers is summed as their KV pools are (256 each)
            assert handle.capacity == Capacity(40_000, handle.capacity.max_running_requests, servers=2,
                                               source="server_info", cuda_graph_max_bs=512)
            body = {"model": handle.model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            r = await http.post_json(url + "/v1/chat/completions", body, timeout_s=30)
            assert r.status == 200


async def test_attach_with_a_dead_url_counts_the_servers_that_answer(http, sims, events):
    dead = f"http://127.0.0.1:{free_port()}"
    urls = [sims[0].url, dead, sims[1].url]
    async with started(run_attached, urls, http=http) as handle:
        line = handle.summary_line()
        assert handle.fleet.up_urls == [sims[0].url, sims[1].url] and handle.fleet.down_urls == [dead]
        assert handle.capacity.max_total_num_tokens == 40_000
    assert line == "2 of 3 servers up: Kimi-K2.5 tp=1 kv=auto 40,000 KV tokens, max running 4,096"
    assert f"attached to {', '.join(urls)}: {line}" in events
