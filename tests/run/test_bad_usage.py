"""Answers that cannot be written as they came (impossible usage, no choices, empty), in-process: each is a
bad answer saying what came back; an empty one is not retried as the same request."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.records import Failure, Prompt, Sample
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.wire import ClientSettings, loop_seed

from mock_http import mock_http

PROMPT = Prompt("T-1", ({"role": "user", "content": "q"},))
USAGE = {"prompt_tokens": 10, "completion_tokens": 5}


def _settings(streamed: bool, **sampling) -> ClientSettings:
    g = GenerationConfig(max_attempts=3, retry_initial_wait_s=0.001, retry_max_wait_s=0.002,
                         on_loop="retry" if streamed else "off")
    return ClientSettings(model="m", backend="sim", sampling=SamplingConfig(**{"max_new_tokens": 64, **sampling}),
                          generation=g)


def _answer(streamed: bool, usage: dict, content: str = "hi", choices: bool = True) -> httpx.Response:
    if not streamed:
        body = {"id": "r", "usage": usage, "choices": [
            {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}] if choices else []}
        return httpx.Response(200, json=body)
    chunks = [{"id": "r", "choices": [{"delta": {"content": content}, "finish_reason": "stop"}] if choices else [],
               "usage": usage}]
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, content=data, headers={"content-type": "text/event-stream"})


async def _regenerate(settings: ClientSettings, answers) -> tuple[Sample | Failure, list[dict]]:
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return answers(len(sent))

    async with mock_http(handler) as http:
        return await ChatClient(http, ["http://s"], settings).regenerate(PROMPT, "T"), sent


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(("usage", "said"), [
    ({"prompt_tokens": 10, "completion_tokens": 10**15}, "completion_tokens = 1000000000000000 with max_new_tokens 64"),
    ({"prompt_tokens": 10, "completion_tokens": 64 + 65}, "completion_tokens = 129 with max_new_tokens 64"),
    ({"prompt_tokens": -7, "completion_tokens": 5}, "prompt_tokens = -7"),
    ({"prompt_tokens": 10, "completion_tokens": "5"}, "completion_tokens = '5' with max_new_tokens 64"),
    ({"prompt_tokens": 10.5, "completion_tokens": 5}, "prompt_tokens = 10.5"),
])
async def test_impossible_usage_is_a_bad_answer_retried_and_said(streamed: bool, usage: dict, said: str) -> None:
    got, sent = await _regenerate(_settings(streamed), lambda n: _answer(streamed, usage))
    assert isinstance(got, Failure) and len(sent) == 3
    assert (got.reason, got.attempts, got.retryable) == ("bad_response", 3, True)
    assert got.detail == f"gave up after 3 attempts: the answer's usage is impossible: {said}"


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_a_retry_after_impossible_usage_writes_the_good_answer(streamed: bool) -> None:
    bad = {"prompt_tokens": 10, "completion_tokens": 10**15}
    got, sent = await _regenerate(_settings(streamed), lambda n: _answer(streamed, bad if n == 1 else USAGE))
    assert isinstance(got, Sample) and len(sent) == 2
    assert (got.meta["prompt_tokens"], got.meta["completion_tokens"], got.meta["per_turn"][0]["attempts"]) == (10, 5, 2)


async def test_usage_at_the_cap_plus_slack_is_kept() -> None:
    at_cap = {"prompt_tokens": 0, "completion_tokens": 128}
    got, _ = await _regenerate(_settings(False), lambda n: _answer(False, at_cap))
    assert isinstance(got, Sample) and got.meta["completion_tokens"] == 128


@pytest.mark.parametrize(("streamed", "said"), [
    (True, 'the server answered 200 with no choices (1 chunks; the last: {"id":"r","choices":[],"usage":'
           '{"prompt_tokens":10,"completion_tokens":5}})'),
    (False, 'the answer had no choices: {"id":"r","usage":{"prompt_tokens":10,"completion_tokens":5},"choices":[]}'),
], ids=["streamed", "whole"])
async def test_a_200_with_no_choices_says_what_came_back(streamed: bool, said: str) -> None:
    got, _ = await _regenerate(_settings(streamed), lambda n: _answer(streamed, USAGE, choices=False))
    assert isinstance(got, Failure)
    assert (got.reason, got.detail) == ("bad_response", f"gave up after 3 attempts: {said}")


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_an_empty_greedy_answer_is_not_retried_and_says_why(streamed: bool) -> None:
    got, sent = await _regenerate(_settings(streamed, temperature=0.0), lambda n: _answer(streamed, USAGE, content=""))
    assert isinstance(got, Failure) and len(sent) == 1
    assert (got.reason, got.attempts, got.retryable) == ("empty_turn", 1, False)
    assert got.detail == ("the assistant turn is empty (5 completion tokens, finish_reason stop); not retried: at "
                          "temperature 0 the model decodes greedily, a retry would repeat it")


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_an_empty_answer_at_a_fixed_seed_is_retried_with_another_seed(streamed: bool) -> None:
    got, sent = await _regenerate(_settings(streamed, temperature=0.7, seed=7),
                                  lambda n: _answer(streamed, USAGE, content="" if n == 1 else "hi"))
    assert isinstance(got, Sample) and got.meta["per_turn"][0]["empty"] == 1
    first = orjson.dumps(sent[0])
    assert [b["seed"] for b in sent] == [7, loop_seed(first, 1)] and loop_seed(first, 1) != 7


async def test_an_empty_answer_without_a_seed_is_retried_as_it_was() -> None:
    got, sent = await _regenerate(_settings(False, temperature=0.7), lambda n: _answer(False, USAGE, content=""))
    assert isinstance(got, Failure) and len(sent) == 3 and "seed" not in sent[2]
    assert got.detail == ("gave up after 3 attempts: the assistant turn is empty (5 completion tokens, "
                          "finish_reason stop)")


async def test_a_stream_ended_with_no_finish_reason_is_a_bad_answer_not_a_lost_server() -> None:
    chunk = {"id": "r", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}], "usage": USAGE}
    data = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
    answer = httpx.Response(200, content=data, headers={"content-type": "text/event-stream"})
    got, _ = await _regenerate(_settings(True), lambda n: answer)
    assert isinstance(got, Failure)
    assert (got.reason, got.detail) == ("bad_response", "gave up after 3 attempts: the answer ended ([DONE]) with no "
                                                        "finish_reason (5 tokens decoded)")
