"""The client over real TCP: transport failures mapped onto the kinds it retries; in a fleet, a server that
cannot be connected to is taken out, one slow to answer is not."""

from __future__ import annotations

import time

import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import RequestError
from gen_pipeline.http import open_http
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.wire import ClientSettings
from gen_pipeline.server.fleet import Fleet
from sglang_sim.testing import start_sim

MESSAGES = [{"role": "user", "content": "hello"}]
# serving "m", the model the requests name (an answer naming another is refused)
FAST = ["--sim-profile", "fast", "--time-scale", "1000", "--sim-startup-s", "0", "--served-model-name", "m"]


def generation(**kw) -> GenerationConfig:
    return GenerationConfig(**{"max_attempts": 1, "connect_timeout_s": 2.0, "request_timeout_s": 10.0,
                               "retry_initial_wait_s": 0.001, "retry_max_wait_s": 0.002, **kw})


async def complete(urls: str | list[str], fleet: Fleet | None = None, **gen) -> object:
    g = generation(**gen)
    settings = ClientSettings(model="m", backend="sim", sampling=SamplingConfig(max_new_tokens=8), generation=g)
    urls = [urls] if isinstance(urls, str) else urls
    async with open_http(g, 8) as http:
        return await ChatClient(http, urls, settings, fleet=fleet).complete(MESSAGES)


@pytest.fixture(scope="module")
def sim():
    with start_sim(FAST) as s:
        yield s


async def test_a_black_holed_server_is_taken_out_of_the_fleet(sim, black_hole, events) -> None:
    """Listed first, the black hole gets the first attempts (fewest in flight, list order); two connect
    timeouts in a row take it out and the third attempt goes to the simulator."""
    fleet = Fleet([black_hole, sim.url], fail_after=2)
    started = time.monotonic()
    turn = await complete([black_hole, sim.url], fleet, max_attempts=3, connect_timeout_s=0.3)
    assert turn.completion_tokens > 0 and turn.finish_reason in ("stop", "length")  # the answer, parsed
    assert (fleet.up_urls, fleet.down_urls, fleet.taken_out) == ([sim.url], [black_hole], 1)
    assert events == [f"took {black_hole} out after 2 connection errors in a row; 1 of 2 servers left, "
                      "probing it back with backoff"]
    assert time.monotonic() - started < 10  # two connect timeouts of 0.3 s, not the 10 s read timeout


async def test_a_server_that_accepted_and_does_not_answer_stays_in_the_fleet(sim, silent_server, events) -> None:
    """A read timeout says the server is there and busy: it is retried, never taken out."""
    fleet = Fleet([silent_server, sim.url], fail_after=2)
    with pytest.raises(RequestError) as e:
        await complete([silent_server, sim.url], fleet, max_attempts=3, request_timeout_s=0.3)
    assert (e.value.reason, e.value.attempts) == ("timeout", 3)
    assert str(e.value) == "gave up after 3 attempts: no answer within the request timeout (0.3 s)"
    assert (fleet.up_urls, fleet.taken_out, events) == ([silent_server, sim.url], 0, [])

