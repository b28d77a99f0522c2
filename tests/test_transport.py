"""The aiohttp transport over real TCP against the simulator: every failure maps onto the two
kinds the client retries, and a good answer comes back as bytes."""

from __future__ import annotations

import orjson
import pytest

from sglang_sim.testing import free_port, start_sim
from gen_pipeline.transport import AiohttpTransport, TransportFailure, TransportTimeout

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})


def transport(timeout_s: float = 10.0) -> AiohttpTransport:
    return AiohttpTransport(max_connections=8, connect_timeout_s=2.0, request_timeout_s=timeout_s)


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0"]) as s:
        yield s


async def test_answer_comes_back_as_bytes(sim) -> None:
    async with transport() as t:
        r = await t.post(sim.url + "/v1/chat/completions", BODY)
    assert r.status == 200 and r.content_type.startswith("application/json")
    assert orjson.loads(r.body)["usage"]["completion_tokens"] > 0


async def test_error_status_is_returned_not_raised(sim) -> None:
    async with transport() as t:
        r = await t.post(sim.url + "/v1/chat/completions", b"{}")
    assert 400 <= r.status < 500 and r.body


async def test_nothing_listening_is_a_failure() -> None:
    async with transport() as t:
        with pytest.raises(TransportFailure, match="ClientConnectorError"):
            await t.post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", BODY)


async def test_stall_is_a_timeout() -> None:
    with start_sim(["--sim-profile", "fast", "--sim-startup-s", "0", "--sim-stall-rate", "1", "--sim-stall-s", "30"]) as s:
        async with transport(timeout_s=0.5) as t:
            with pytest.raises(TransportTimeout):
                await t.post(s.url + "/v1/chat/completions", BODY)


async def test_cut_mid_body_is_a_failure() -> None:
    with start_sim(["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0",
                    "--sim-cut-rate", "1"]) as s:
        async with transport() as t:
            with pytest.raises(TransportFailure):
                await t.post(s.url + "/v1/chat/completions", BODY)
