"""The client's JSON contract, with recorded answers (httpx.MockTransport in-process, tests/mock_http.py):
request fields, regeneration order, retries (503, 429, timeouts, bad bodies) and final 4xx failures
with the server's message."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.records import Failure, Prompt, Sample
from gen_pipeline.run.answer import judge, split_think
from gen_pipeline.run.chat import ChatClient
from gen_pipeline.run.wire import ClientSettings, build_request, parse_response

from mock_http import mock_http

GEN = GenerationConfig(max_attempts=3, retry_initial_wait_s=0.001, retry_max_wait_s=0.002)


def settings(**gen) -> ClientSettings:
    return ClientSettings(model="m", backend="sim", sampling=SamplingConfig(max_new_tokens=64, temperature=0.5,
                                                                            top_p=0.9),
                          generation=GenerationConfig(**{**GEN.__dict__, **gen}), kv_cache_dtype="fp8_e4m3")


def completion(content: str, *, reasoning: str | None = None, finish: str = "stop", usage: bool = True) -> dict:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                  "reasoning_content": reasoning}, "finish_reason": finish}]}
    if usage:
        body["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return body


class Mock:
    """One in-process server whose handler each test sets (through client_with)."""

    def __init__(self) -> None:
        self.handler = None
        self.http = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert self.handler is not None, "client_with sets the handler"
        return self.handler(request)


@pytest.fixture
async def mock():
    server = Mock()
    async with mock_http(server) as http:
        server.http = http
        yield server


def client_with(mock: Mock, handler, **gen) -> tuple[ChatClient, list[dict]]:
    seen: list[dict] = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return handler(request, len(seen))

    mock.handler = wrapped
    return ChatClient(mock.http, ["http://s"], settings(**gen)), seen


PROMPT = Prompt("T-1", ({"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                        {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "q2"}))


async def test_every_assistant_turn_regenerated_in_order_with_history(mock) -> None:
    client, seen = client_with(
        mock, lambda r, n: httpx.Response(200, json=completion(f"answer {n}", reasoning=f"why {n}")), reasoning="keep")
    sample = await client.regenerate(PROMPT, "T")
    assert isinstance(sample, Sample)
    assert [m["content"] for m in seen[1]["messages"]] == ["sys", "q1", "answer 1", "q2"]
    assert "old answer" not in orjson.dumps(seen).decode()
    assert sample.conversations == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer 1", "reasoning_content": "why 1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "answer 2", "reasoning_content": "why 2"}]
    meta = sample.meta
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["turns"]) == (20, 10, 2)
    assert meta["finish_reason"] == "stop" and meta["kv_cache_dtype"] == "fp8_e4m3" and meta["backend"] == "sim"
    assert meta["sampling"] == {"max_new_tokens": 64, "temperature": 0.5, "top_p": 0.9}


def test_request_fields() -> None:
    body = build_request([{"role": "user", "content": "q"}], settings(reasoning="disable"))
    assert body == {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 64,
                    "temperature": 0.5, "top_p": 0.9, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "chat_template_kwargs": {"thinking": False, "enable_thinking": False}}
    assert "chat_template_kwargs" not in build_request([], settings(reasoning="keep"))


async def test_400_is_final_with_the_server_message(mock) -> None:
    msg = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
    client, seen = client_with(mock, lambda r, n: httpx.Response(
        400, json={"object": "error", "message": msg, "type": "BadRequestError", "code": 400}))
    failure = await client.regenerate(Prompt("T-3", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(failure, Failure) and len(seen) == 1
    assert (failure.reason, failure.detail, failure.retryable) == ("http_400", f"HTTP 400: {msg}", False)


async def test_retries_exhausted_is_a_retryable_failure(mock) -> None:
    client, seen = client_with(mock, lambda r, n: httpx.Response(500, text="Internal Server Error"))
    failure = await client.regenerate(Prompt("T-4", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(failure, Failure) and len(seen) == 3
    assert failure.reason == "http_500" and failure.retryable
    assert failure.detail == "gave up after 3 attempts: Internal Server Error"


def raising(exc: type[Exception], message: str) -> object:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc(message, request=request)
    return handler


@pytest.mark.parametrize("faults", [
    [lambda r: httpx.Response(503, json={"message": "busy"}), lambda r: httpx.Response(429, json={"message": "busy"})],
    [raising(httpx.ReadTimeout, "slow"), raising(httpx.RemoteProtocolError, "peer closed connection")],
    [lambda r: httpx.Response(200, content=b"{not json", headers={"content-type": "application/json"})],
    [lambda r: httpx.Response(200, content=b"<html>hi</html>", headers={"content-type": "text/html"})],
    [lambda r: httpx.Response(200, json=completion("x", usage=False))],
    [lambda r: httpx.Response(200, json={"choices": []})],
], ids=["503-then-429", "timeout-then-cut", "not-json", "html", "no-usage", "no-choices"])
async def test_retryable_failures_and_malformed_bodies_are_retried_then_succeed(mock, faults) -> None:
    client, seen = client_with(mock, lambda r, n: faults[n - 1](r) if n <= len(faults)
                               else httpx.Response(200, json=completion("fine")))
    sample = await client.regenerate(Prompt("T-5", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(sample, Sample) and len(seen) == len(faults) + 1


@pytest.mark.parametrize(("exc", "reason", "detail"), [
    (httpx.ConnectError, "connect", "cannot connect to s:80: All connection attempts failed"),
    (httpx.ConnectTimeout, "connect", "cannot connect to s:80: no connection within 10 s (the host is down, or "
                                      "something on the way drops the packets)"),
    (httpx.ReadTimeout, "timeout", "no answer within the request timeout (3600 s)"),
    (httpx.RemoteProtocolError, "connection", "the connection to s:80 was lost (RemoteProtocolError: "
                                              "All connection attempts failed)"),
])
async def test_each_transport_failure_is_a_failure_of_its_kind(mock, exc, reason, detail) -> None:
    def handler(request: httpx.Request, n: int) -> httpx.Response:
        raise exc("All connection attempts failed", request=request)
    client, seen = client_with(mock, handler, max_attempts=2)
    failure = await client.regenerate(Prompt("T-7", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(failure, Failure) and len(seen) == 2
    assert (failure.reason, failure.detail, failure.attempts, failure.retryable) == (
        reason, f"gave up after 2 attempts: {detail}", 2, True)


async def test_truncated_turn_ends_the_conversation_or_is_dropped(mock) -> None:
    client, seen = client_with(mock, lambda r, n: httpx.Response(200, json=completion("cut", finish="length")))
    sample = await client.regenerate(PROMPT, "T")
    assert isinstance(sample, Sample) and len(seen) == 1
    assert sample.meta["finish_reason"] == "length" and sample.meta["turns"] == 1
    assert sample.conversations[-1] == {"role": "assistant", "content": "cut"}
    client, _ = client_with(mock, lambda r, n: httpx.Response(200, json=completion("cut", finish="length")),
                            truncated="drop")
    failure = await client.regenerate(PROMPT, "T")
    assert isinstance(failure, Failure) and (failure.reason, failure.retryable) == ("truncated", False)


def test_think_markers_never_stay_in_content() -> None:
    assert split_think("<think>plan</think>\n\nanswer") == ("plan", "answer")
    assert split_think("plan</think>answer") == ("plan", "answer")
    turn = judge(parse_response(completion("<think>a</think>b")), GenerationConfig(reasoning="keep"))
    assert (turn.reasoning, turn.content, turn.leak) == ("a", "b", "think_marker")


@pytest.mark.parametrize("routing, expected", [
    ("affinity", ["http://a", "http://a", "http://a"]),  # the history is cached on a: every turn goes there
    ("free-kv", ["http://a", "http://b", "http://a"]),  # each turn to whichever is freer at the time
])
async def test_a_samples_turns_stay_on_one_server_under_affinity(mock, routing, expected) -> None:
    from gen_pipeline.records import LoadSnapshot
    from gen_pipeline.server.fleet import Fleet
    fleet = Fleet(["http://a", "http://b"], routing=routing)
    for url in fleet.urls:
        fleet.set_capacity(url, 10_000)
    hosts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        hosts.append(f"http://{request.url.host}")
        # the server that ran this turn is now 500 tokens fuller than the other (within the margin)
        fleet.update({u: LoadSnapshot(t_s=0.0, running=0, queued=0, used_tokens=500 if u == hosts[-1] else 0,
                                      token_usage=None) for u in fleet.urls})
        return httpx.Response(200, json=completion(f"answer {len(hosts)}"))

    mock.handler = answer
    client = ChatClient(mock.http, fleet.urls, settings(), fleet=fleet)
    three = Prompt("T-3", tuple({"role": "user", "content": f"q{i}"} for i in range(3)))
    assert isinstance(await client.regenerate(three, "T"), Sample)
    assert hosts == expected and fleet.samples_tracked == 0
    mock.handler = lambda request: httpx.Response(400, json={"error": {"message": "too long"}})
    assert isinstance(await client.regenerate(three, "T"), Failure) and fleet.samples_tracked == 0
