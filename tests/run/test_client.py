"""The client's JSON contract, with recorded answers (httpx.MockTransport in-process, tests/mock_http.py):
request fields, regeneration order, retries and final failures with the server's message, answers that cannot
be written as they came, and tool-use conversations in SGLang 0.5.17's shapes (serving_chat.py)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import ServerError
from gen_pipeline.quality import RepetitionDetector
from gen_pipeline.records import Failure, LoadSnapshot, Prompt, Sample
from gen_pipeline.run.answer import judge, split_think
from gen_pipeline.run.chat import ChatClient, same_calls
from gen_pipeline.run.wire import ClientSettings, TurnStream, build_request, loop_seed, parse_response
from gen_pipeline.server.fleet import Fleet

from mock_http import mock_http

USAGE = {"prompt_tokens": 10, "completion_tokens": 5}
Q = Prompt("T-1", ({"role": "user", "content": "q"},))
PROMPT = Prompt("T-1", ({"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                        {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "q2"}))


def settings(sampling: dict | None = None, **gen) -> ClientSettings:
    g = GenerationConfig(**{"max_attempts": 3, "retry_initial_wait_s": 0.001, "retry_max_wait_s": 0.002, **gen})
    return ClientSettings(model="m", backend="sim", generation=g, kv_cache_dtype="fp8_e4m3", sampling=SamplingConfig(
        **{"max_new_tokens": 64, "temperature": 0.5, "top_p": 0.9, **(sampling or {})}))


def completion(content: str = "", *, reasoning: str | None = None, calls: list | None = None, finish: str = "",
               usage: dict | None = USAGE, choices: bool = True, model: str = "") -> dict:
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}
    finish = finish or ("tool_calls" if calls else "stop")
    body: dict = {"id": "r", "choices": [{"index": 0, "message": message, "finish_reason": finish}] if choices else []}
    return body | ({"usage": usage} if usage else {}) | ({"model": model} if model else {})


def answer(streamed: bool, usage: dict = USAGE, content: str = "hi", choices: bool = True,
           model: str = "") -> httpx.Response:
    if not streamed:
        return httpx.Response(200, json=completion(content, usage=usage, choices=choices, model=model))
    return sse({"id": "r", "choices": [{"delta": {"content": content}, "finish_reason": "stop"}] if choices else [],
                "usage": usage} | ({"model": model} if model else {}))


def sse(*chunks: dict) -> httpx.Response:
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, content=data, headers={"content-type": "text/event-stream"})


def on_loop(streamed: bool) -> str:
    return "retry" if streamed else "off"  # the loop gate on: turns are streamed


async def regenerate(reply, prompt: Prompt = Q, s: ClientSettings | None = None) -> tuple[Sample | Failure, list]:
    """`reply(request, n)` answers the n-th request; returns the result and the bodies sent."""
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return reply(request, len(sent))

    async with mock_http(handler) as http:
        return await ChatClient(http, ["http://s"], s or settings()).regenerate(prompt, "T"), sent


def raising(exc: type[Exception], message: str = "All connection attempts failed") -> object:
    def handler(request: httpx.Request, n: int = 0) -> httpx.Response:
        raise exc(message, request=request)
    return handler


async def test_every_assistant_turn_regenerated_in_order_with_history() -> None:
    reply = lambda r, n: httpx.Response(200, json=completion(f"answer {n}", reasoning=f"why {n}"))  # noqa: E731
    sample, seen = await regenerate(reply, PROMPT, settings(reasoning="keep"))
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
    assert "tools" not in seen[0] and "tool_choice" not in seen[0]  # a sample without tools sends none
    assert "tools" not in meta and "tool_divergence" not in meta


def test_request_fields() -> None:
    body = build_request([{"role": "user", "content": "q"}], settings(reasoning="disable"))
    assert body == {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 64,
                    "temperature": 0.5, "top_p": 0.9, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "chat_template_kwargs": {"thinking": False, "enable_thinking": False}}
    assert "chat_template_kwargs" not in build_request([], settings(reasoning="keep"))
    # a draft's acceptance per turn (return_meta_info) only on whole answers: SGLang 0.5.17 refuses it on a stream
    whole = replace(settings(on_loop="off"), speculative=True)
    assert build_request([], whole)["return_meta_info"] is True and build_request([], whole)["stream"] is False
    assert "return_meta_info" not in build_request([], replace(whole, generation=GenerationConfig(on_loop="retry")))
    assert "return_meta_info" not in body and "return_meta_info" not in build_request([], settings(on_loop="off"))


MSG = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."


@pytest.mark.parametrize(("reply", "attempts", "reason", "detail"), [
    (lambda r, n: httpx.Response(400, json={"object": "error", "message": MSG, "type": "BadRequestError", "code": 400}),
     1, "http_400", f"HTTP 400: {MSG}"),
    (lambda r, n: httpx.Response(500, text="Internal Server Error"), 3, "http_500",
     "gave up after 3 attempts: Internal Server Error"),
    (raising(httpx.ConnectError), 3, "connect",
     "gave up after 3 attempts: cannot connect to s:80: All connection attempts failed"),
    (raising(httpx.ConnectTimeout), 3, "connect", "gave up after 3 attempts: cannot connect to s:80: no connection "
     "within 10 s (the host is down, or something on the way drops the packets)"),
    (raising(httpx.ReadTimeout), 3, "timeout",
     "gave up after 3 attempts: no answer within the request timeout (3600 s)"),
    (raising(httpx.RemoteProtocolError), 3, "connection", "gave up after 3 attempts: the connection to s:80 was lost "
                                                          "(RemoteProtocolError: All connection attempts failed)"),
], ids=["400-final", "500", "connect", "connect-timeout", "read-timeout", "cut"])
async def test_each_failure_has_its_reason_attempts_and_message(reply, attempts: int, reason: str, detail: str) -> None:
    failure, seen = await regenerate(reply)
    assert isinstance(failure, Failure) and len(seen) == attempts
    assert (failure.reason, failure.detail, failure.attempts, failure.retryable) == (
        reason, detail, attempts, reason != "http_400")


@pytest.mark.parametrize("faults", [
    [lambda r: httpx.Response(503, json={"message": "busy"}), lambda r: httpx.Response(429, json={"message": "busy"})],
    [raising(httpx.ReadTimeout, "slow"), raising(httpx.RemoteProtocolError, "peer closed connection")],
    [lambda r: httpx.Response(200, content=b"{not json", headers={"content-type": "application/json"})],
    [lambda r: httpx.Response(200, content=b"<html>hi</html>", headers={"content-type": "text/html"})],
    [lambda r: httpx.Response(200, json=completion("x", usage=None))],
    [lambda r: answer(True, {"prompt_tokens": 10, "completion_tokens": 10**15})],
    [lambda r: answer(False, {"prompt_tokens": 10, "completion_tokens": 10**15})],
], ids=["503-then-429", "timeout-then-cut", "not-json", "html", "no-usage", "bad-usage-streamed", "bad-usage-whole"])
async def test_retryable_failures_and_malformed_bodies_are_retried_then_succeed(faults) -> None:
    sample, seen = await regenerate(lambda r, n: faults[n - 1](r) if n <= len(faults)
                                    else httpx.Response(200, json=completion("fine")))
    assert isinstance(sample, Sample) and len(seen) == len(faults) + 1
    meta = sample.meta  # the good answer's figures, none of the bad ones'
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["per_turn"][0]["attempts"]) == (10, 5, len(seen))


async def test_truncated_turn_ends_the_conversation_or_is_dropped() -> None:
    cut = lambda r, n: httpx.Response(200, json=completion("cut", finish="length"))  # noqa: E731
    sample, seen = await regenerate(cut, PROMPT)
    assert isinstance(sample, Sample) and len(seen) == 1
    assert sample.meta["finish_reason"] == "length" and sample.meta["turns"] == 1
    assert sample.conversations[-1] == {"role": "assistant", "content": "cut"}
    failure, _ = await regenerate(cut, PROMPT, settings(truncated="drop"))
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
async def test_a_samples_turns_stay_on_one_server_under_affinity(routing, expected) -> None:
    fleet = Fleet(["http://a", "http://b"], routing=routing)
    for url in fleet.urls:
        fleet.set_capacity(url, 10_000)
    hosts: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        if len(hosts) == 3:  # the second sample: refused
            return httpx.Response(400, json={"error": {"message": "too long"}})
        hosts.append(f"http://{request.url.host}")
        # the server that ran this turn is now 500 tokens fuller than the other (within the margin)
        fleet.update({u: LoadSnapshot(t_s=0.0, running=0, queued=0, used_tokens=500 if u == hosts[-1] else 0,
                                      token_usage=None) for u in fleet.urls})
        return httpx.Response(200, json=completion(f"answer {len(hosts)}"))

    three = Prompt("T-3", tuple({"role": "user", "content": f"q{i}"} for i in range(3)))
    async with mock_http(reply) as http:
        client = ChatClient(http, fleet.urls, settings(), fleet=fleet)
        assert isinstance(await client.regenerate(three, "T"), Sample)
        assert hosts == expected and fleet.samples_tracked == 0
        assert isinstance(await client.regenerate(three, "T"), Failure) and fleet.samples_tracked == 0


@pytest.mark.parametrize("streamed", [True, False], ids=["chunks", "whole"])
async def test_an_answer_naming_another_model_leaves_its_server_out_and_the_last_such_ends_the_run(streamed) -> None:
    """A server restarted with another model is refused by name (each answer's `model`), never written from."""
    seen: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return answer(streamed, model="m-two" if request.url.host == "a" else "m")

    fleet = Fleet(["http://a", "http://b"])
    async with mock_http(reply) as http:
        client = ChatClient(http, fleet.urls, settings(on_loop=on_loop(streamed)), fleet=fleet)
        turn = await client.complete([{"role": "user", "content": "q"}])
        fleet.succeeded("http://a")  # an answer's headers later: still out
        assert (turn.content, fleet.up_urls, fleet.refused) == ("hi", ["http://b"], {"http://a": "m-two"})
        await client.complete([{"role": "user", "content": "q"}])
        assert seen == ["a", "b", "b"]
        with pytest.raises(ServerError) as e:  # the only server serves another model: the run ends
            await ChatClient(http, ["http://a"], settings(on_loop=on_loop(streamed))).regenerate(Q, "T")
    assert str(e.value) == (
        "No server serves 'm' any more (http://a now serves 'm-two'): restarted with another model? Nothing "
        "written is lost and nothing the other model answered was written: serve 'm' there again and run the "
        "same command to resume.")
    assert seen == ["a", "b", "b", "a"]


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(("usage", "said"), [
    ({"prompt_tokens": 10, "completion_tokens": 10**15}, "completion_tokens = 1000000000000000 with max_new_tokens 64"),
    ({"prompt_tokens": 10, "completion_tokens": 64 + 65}, "completion_tokens = 129 with max_new_tokens 64"),
    ({"prompt_tokens": -7, "completion_tokens": 5}, "prompt_tokens = -7"),
    ({"prompt_tokens": 10, "completion_tokens": "5"}, "completion_tokens = '5' with max_new_tokens 64"),
    ({"prompt_tokens": 10.5, "completion_tokens": 5}, "prompt_tokens = 10.5"),
])
async def test_impossible_usage_is_a_bad_answer_retried_and_said(streamed: bool, usage: dict, said: str) -> None:
    got, sent = await regenerate(lambda r, n: answer(streamed, usage), s=settings(on_loop=on_loop(streamed)))
    assert isinstance(got, Failure) and len(sent) == 3
    assert (got.reason, got.attempts, got.retryable) == ("bad_response", 3, True)
    assert got.detail == f"gave up after 3 attempts: the answer's usage is impossible: {said}"


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_usage_at_the_cap_plus_the_slack_is_kept(streamed: bool) -> None:
    at_cap, _ = await regenerate(lambda r, n: answer(streamed, {"prompt_tokens": 0, "completion_tokens": 128}),
                                 s=settings(on_loop=on_loop(streamed)))
    assert isinstance(at_cap, Sample) and at_cap.meta["completion_tokens"] == 128


NO_FINISH = {"id": "r", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}], "usage": USAGE}
EMPTY = '{"id":"r","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5}}'


@pytest.mark.parametrize(("streamed", "reply", "said"), [
    (True, lambda: answer(True, choices=False),
     f"the server answered 200 with no choices (1 chunks; the last: {EMPTY})"),
    (False, lambda: answer(False, choices=False), f"the answer had no choices: {EMPTY}"),
    # a stream that ends with no finish_reason is a bad answer, not a lost server
    (True, lambda: sse(NO_FINISH), "the answer ended ([DONE]) with no finish_reason (5 tokens decoded)"),
], ids=["streamed", "whole", "no-finish-reason"])
async def test_a_200_with_no_choices_or_no_finish_says_what_came_back(streamed: bool, reply, said: str) -> None:
    got, _ = await regenerate(lambda r, n: reply(), s=settings(on_loop=on_loop(streamed)))
    assert isinstance(got, Failure)
    assert (got.reason, got.detail) == ("bad_response", f"gave up after 3 attempts: {said}")


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_an_empty_answer_is_final_when_greedy_redrawn_at_a_fixed_seed_else_retried_as_it_was(streamed) -> None:
    def s(**sampling: float) -> ClientSettings:
        return settings(sampling, on_loop=on_loop(streamed))

    greedy, sent = await regenerate(lambda r, n: answer(streamed, content=""), s=s(temperature=0.0))
    assert isinstance(greedy, Failure) and len(sent) == 1
    assert (greedy.reason, greedy.attempts, greedy.retryable) == ("empty_turn", 1, False)
    assert greedy.detail == ("the assistant turn is empty (5 completion tokens, finish_reason stop); not retried: at "
                             "temperature 0 the model decodes greedily, a retry would repeat it")
    seeded, sent = await regenerate(lambda r, n: answer(streamed, content="" if n == 1 else "hi"),
                                    s=s(temperature=0.7, seed=7))
    assert isinstance(seeded, Sample) and seeded.meta["per_turn"][0]["empty"] == 1
    first = orjson.dumps(sent[0])
    assert [b["seed"] for b in sent] == [7, loop_seed(first, 1)] and loop_seed(first, 1) != 7
    unseeded, sent = await regenerate(lambda r, n: answer(streamed, content=""), s=s(temperature=0.7))
    assert isinstance(unseeded, Failure) and len(sent) == 3 and "seed" not in sent[2]
    assert unseeded.detail == ("gave up after 3 attempts: the assistant turn is empty (5 completion tokens, "
                               "finish_reason stop)")


# the sample ends at the first regenerated call that differs from the source's (meta.tool_divergence)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def call(cid: str | None, args: str | dict, name: str | None = "get_weather") -> dict:
    return {"id": cid, "index": 0, "type": "function", "function": {"name": name, "arguments": args}}


SOURCE = Prompt("T-1", (
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [call("src_0", '{"city": "Paris"}')]},
    {"role": "tool", "content": '{"temp": 12}', "tool_call_id": "src_0"},
    {"role": "assistant", "content": "12 degrees."},
    {"role": "user", "content": "and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("src_1", '{"city": "Rome"}')]},
    {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "src_1"},
    {"role": "assistant", "content": "20 degrees."},
), tools=orjson.dumps(TOOLS).decode())


def test_a_whole_answer_of_tool_calls_is_read_with_its_finish_reason() -> None:
    turn = parse_response(completion(calls=[call("call_a", '{"city": "Paris"}')]))
    assert (turn.content, turn.finish_reason) == ("", "tool_calls")
    assert turn.tool_calls == [{"id": "call_a", "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    # SGLang may send arguments as an object (FunctionResponse.arguments: str | dict): kept as JSON text
    assert parse_response(completion(calls=[call("c", {"city": "Oslo"})])).tool_calls[0]["function"]["arguments"] == \
        '{"city":"Oslo"}'  # type: ignore[index]


def test_streamed_tool_call_pieces_are_joined() -> None:
    stream = TurnStream(RepetitionDetector())
    base = {"id": "r", "model": "m", "object": "chat.completion.chunk"}
    # the first piece names the call, the next ones (id and name null) carry pieces of its arguments
    pieces = [{"role": "assistant", "content": ""},
              {"tool_calls": [call("functions.get_weather:0", "")]},
              *({"tool_calls": [call(None, args, name=None)]} for args in ('{"city": ', '"Paris"}'))]
    for delta in pieces:
        stream.feed({**base, "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta},
                                          "finish_reason": None}], "usage": USAGE})
    stream.feed({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    turn = stream.result()
    assert (turn.content, turn.finish_reason) == ("", "tool_calls")
    assert turn.tool_calls == [{"id": "functions.get_weather:0", "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]


def test_same_calls_compares_arguments_as_json() -> None:
    assert same_calls([call("a", '{"a": 1, "b": [2]}')], [call("b", '{"b": [2],  "a": 1}')])
    assert not same_calls([call("a", '{"a": 1}')], [call("b", '{"a": 2}')])
    assert not same_calls([call("a", "{}", name="x")], [call("a", "{}")])
    assert same_calls(None, None) and not same_calls(None, [call("a", "{}")])


async def with_tools(answers: list[dict], prompt: Prompt = SOURCE) -> tuple[Sample, list[dict]]:
    sample, seen = await regenerate(lambda r, n: httpx.Response(200, json=answers[n - 1]), prompt,
                                    settings(on_loop="off"))
    assert isinstance(sample, Sample), sample
    return sample, seen


async def test_matching_calls_keep_the_sources_results_and_regenerate_every_turn() -> None:
    sample, seen = await with_tools([completion(calls=[call("new_0", '{"city":"Paris"}')]), completion("It is 12."),
                                     completion(calls=[call("new_1", '{"city": "Rome"}')]), completion("It is 20.")])
    assert len(seen) == 4 and all(b["tools"] == TOOLS and b["tool_choice"] == "auto" for b in seen)
    # the history sent: the regenerated calls, the source's results answering them by the new ids
    assert seen[1]["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "new_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "content": '{"temp": 12}', "tool_call_id": "new_0"}]
    assert [m["role"] for m in sample.conversations] == ["user", "assistant", "tool", "assistant"] * 2
    assert [t["finish_reason"] for t in sample.meta["per_turn"]] == ["tool_calls", "stop", "tool_calls", "stop"]
    assert (sample.meta["tool_divergence"], sample.meta["tools"]) == (0, SOURCE.tools)
    assert sample.conversations[1]["content"] == "" and sample.meta["per_turn"][0]["empty"] == 0


@pytest.mark.parametrize(("answers", "turns"), [
    ([completion(calls=[call("n", '{"city": "Lyon"}')])], 1),  # other arguments
    ([completion("I cannot look that up.")], 1),  # text where the source called
    ([completion(calls=[call("n", '{"city": "Paris"}')]), completion(calls=[call("m", '{"city": "Paris"}')])], 2),
])
async def test_the_sample_ends_at_the_first_divergence(answers: list[dict], turns: int) -> None:
    sample, seen = await with_tools(answers)
    assert len(seen) == turns and sample.meta["turns"] == turns
    assert sample.meta["tool_divergence"] == turns
    last, reply = sample.conversations[-1], answers[-1]["choices"][0]["message"]
    assert last["role"] == "assistant" and last["content"] == reply["content"]  # kept as the target produced it
    assert [c["function"] for c in last.get("tool_calls") or []] == [c["function"] for c in reply["tool_calls"] or []]


async def test_tool_turns_without_tools_diverge_where_the_target_answers_in_text() -> None:
    # a source with tool turns but no `tools` column: nothing to send, the target answers in text, and the
    # source's results (of calls the target did not make) are never sent after it
    sample, seen = await with_tools([completion("It is probably mild.")] * 4, Prompt("T-3", SOURCE.messages))
    assert len(seen) == 1 and "tools" not in seen[0]
    assert (sample.meta["tool_divergence"], sample.meta["tools"], sample.meta["turns"]) == (1, "", 1)
