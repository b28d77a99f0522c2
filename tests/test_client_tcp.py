"""The client over real TCP against the simulator: a good answer, a final 4xx, and every transport
failure mapped onto the two kinds it retries (connection, timeout), with the attempts recorded."""

from __future__ import annotations

import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import RequestError
from gen_pipeline.run.chat import ChatClient, ClientSettings, open_http_session
from sglang_sim.testing import free_port, start_sim

MESSAGES = [{"role": "user", "content": "hello"}]


def generation(**kw) -> GenerationConfig:
    return GenerationConfig(**{"max_attempts": 1, "connect_timeout_s": 2.0, "request_timeout_s": 10.0,
                               "retry_initial_wait_s": 0.001, "retry_max_wait_s": 0.002, **kw})


async def complete(url: str, **gen) -> object:
    g = generation(**gen)
    settings = ClientSettings(model="m", backend="sim", sampling=SamplingConfig(max_new_tokens=8), generation=g)
    async with open_http_session(g, 8) as http:
        return await ChatClient(http, [url], settings).complete(MESSAGES)


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0"]) as s:
        yield s


async def test_answer_comes_back_parsed(sim) -> None:
    turn = await complete(sim.url)
    assert turn.completion_tokens > 0 and turn.finish_reason in ("stop", "length")


async def test_nothing_listening_is_a_connection_failure() -> None:
    with pytest.raises(RequestError) as e:
        await complete(f"http://127.0.0.1:{free_port()}", max_attempts=3)
    assert (e.value.reason, e.value.attempts) == ("connection", 3)
    assert str(e.value).startswith("gave up after 3 attempts: ClientConnectorError: Cannot connect to host")


async def test_stall_is_a_timeout() -> None:
    stall_all = ["--sim-profile", "fast", "--sim-startup-s", "0", "--sim-stall-rate", "1", "--sim-stall-s", "30"]
    with start_sim(stall_all) as s:
        with pytest.raises(RequestError) as e:
            await complete(s.url, request_timeout_s=0.5)
    assert (e.value.reason, e.value.attempts, str(e.value)) == (
        "timeout", 1, "gave up after 1 attempt: no answer within the request timeout")


async def test_cut_mid_body_is_a_connection_failure() -> None:
    with start_sim(["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0",
                    "--sim-cut-rate", "1"]) as s:
        with pytest.raises(RequestError) as e:
            await complete(s.url)
    assert e.value.reason == "connection" and e.value.attempts == 1
    assert str(e.value).startswith("gave up after 1 attempt: ClientPayloadError: ")
