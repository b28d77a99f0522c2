"""POST /v1/chat/completions and POST /generate: request parsing and validation as SGLang
does it (python/sglang/srt/managers/tokenizer_manager.py _validate_one_request), seeded
output, the engine round trip, and the injected faults."""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sglang_sim import degenerate
from sglang_sim import logprobs as LP
from sglang_sim import responses as R
from sglang_sim import tools as T
from sglang_sim.engine import FinishedRequest
from sglang_sim.faults import Fault, FaultSettings, OutputFault, decide_output
from sglang_sim.lengths import cap_length, draw_length, request_seed
from sglang_sim.loop import EngineLoop, Ticket
from sglang_sim.spec import Speculation
from sglang_sim.tokenizer import decode_output, draw_output_ids, encode, render_chat
from sglang_sim.transport import ChunkedResponse, one_chunk, wait_or_disconnect

log = logging.getLogger("sglang_sim")
# Starlette sends whichever ASGI app an endpoint returns; ChunkedResponse is a raw one.
Reply = Response | ChunkedResponse
_HTML_PAGE = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                  "repetition_penalty", "stop", "seed", "min_tokens")


class SimServer(Protocol):
    """What a request reads and counts on the server (sglang_sim/app.py SimServer), named here so that
    this module does not import the app that imports it."""

    ns: argparse.Namespace
    info: dict[str, Any]
    loop: EngineLoop
    faults: FaultSettings
    looping: dict[str, tuple[str, int]]
    output_fault_counts: collections.Counter[str]
    chat_sampling: collections.Counter[str]
    spec: Speculation

    def next_fault(self) -> Fault: ...

    def count_turn(self, user_turns: int, previous_prompt_tokens: int, fin: FinishedRequest) -> None: ...

    def request_completed(self) -> None: ...


class BadRequest(Exception):
    """A 400 with SGLang's error body (`type_`: its "type")."""

    def __init__(self, message: str, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.type_ = type_


def error_response(message: str, status: int = 400, type_: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(R.error_body(message, status, type_), status_code=status)


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"Request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    return body


@dataclass
class Plan:
    """A validated generation request ready for the engine."""

    gen: R.Generation
    max_new_tokens: int
    stream: bool
    fault: Fault
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: LP.LogprobPlan | None = None
    output_fault: OutputFault = OutputFault.NONE
    user_turns: int = 0  # chat: the user messages of the conversation (0: /generate)
    previous_prompt_tokens: int = 0  # chat, turn >= 2: the prompt of the turn before (to its last answer)
    return_prompt_ids: bool = False  # return_prompt_token_ids or return_token_ids (whole answers only)
    return_output_ids: bool = False  # return_token_ids
    return_meta_info: bool = False  # chat, whole answers only


def _check_context(server: SimServer, n_prompt: int, max_new: int | None) -> None:
    ctx = server.info["context_len"]
    if n_prompt >= ctx:
        raise BadRequest(f"The input ({n_prompt} tokens) is longer than the model's context length ({ctx} tokens).")
    if max_new is not None and n_prompt + max_new >= ctx:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {n_prompt + max_new} tokens: {n_prompt} tokens from the input messages "
            f"and {max_new} tokens for the completion. Please reduce the number of tokens in the input "
            f"messages or the completion to fit within the limit.")


def _max_new(value: Any, n_prompt: int, ctx: int, name: str) -> tuple[int | None, int]:
    """(as requested, effective): absent -> the rest of the context (SGLang's default)."""
    if value is None:
        return None, ctx - 1 - n_prompt
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name} must be a positive integer (got {value!r}).")
    return value, value


def _min_tokens(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"min_tokens must be a non-negative integer (got {value!r}).")
    return value


def _plan(server: SimServer, rid: str, prompt_key: str | list[int], prompt_ids: list[int],
          max_new_value: Any, max_new_name: str, sampling: dict[str, Any], reasoning: str, stream: bool,
          logprob_body: dict[str, Any] | None = None) -> Plan:
    requested, max_new = _max_new(max_new_value, len(prompt_ids), server.info["context_len"], max_new_name)
    _check_context(server, len(prompt_ids), requested)
    seed = request_seed(server.ns.sim_seed, prompt_key, {**sampling, "max_new_tokens": requested})
    drawn = draw_length(seed, server.ns.sim_output_mean, server.ns.sim_output_spread)
    # min_tokens (OpenAI API) / min_new_tokens (native): EOS is masked until then, so the usual
    # length distribution starts after it (SGLang's sampling_params.min_new_tokens)
    drawn += _min_tokens(sampling.get("min_tokens", sampling.get("min_new_tokens")))
    n, finish = cap_length(drawn, max_new)
    try:  # return_logprob: the tokens come from the logprob model (sglang_sim/logprob_model.py)
        model_ids, lp_plan = LP.plan(server.ns, logprob_body or {}, prompt_ids, n, sampling, seed)
    except LP.LogprobError as e:
        raise BadRequest(str(e)) from None
    fault = server.next_fault()
    empty = fault is Fault.EMPTY_TURN
    if empty:  # EOS first: one completion token, nothing to show
        n, finish, lp_plan = 1, "stop", None
    output_ids = model_ids if lp_plan else draw_output_ids(seed, n)
    gen = R.Generation(rid=rid, model=server.ns.served_model_name, created=int(time.time()),
                       prompt_ids=prompt_ids, output_ids=output_ids, finish_reason=finish, reasoning=reasoning,
                       empty=empty)
    # What the model writes: seeded by the request (not by arrival), so the same request degenerates
    # the same way in every run. Not with logprobs (their tokens come from the logprob model).
    output_fault = OutputFault.NONE if empty or lp_plan else decide_output(server.faults, seed)
    gen = _degenerate(server, gen, output_fault, seed, drawn, max_new)
    if gen.finish_reason == "stop" and not lp_plan:  # the model's last token is the stop token (SGLang's ids hold it)
        ids = gen.output_ids if output_fault is OutputFault.MARKER_ONLY else gen.output_ids[:-1]
        gen = replace(gen, output_ids=[*ids, R.EOS_TOKEN_ID])
    return Plan(gen, max_new, stream, fault, logprobs=lp_plan, output_fault=output_fault)


def _degenerate(server: SimServer, gen: R.Generation, output_fault: OutputFault, seed: int, drawn: int,
                max_new: int) -> R.Generation:
    """The output of a loop, leak or marker-only turn (sglang_sim/degenerate.py)."""
    if output_fault is OutputFault.LOOP:
        plan = degenerate.loop_output(seed, drawn, max_new)
        # a loop that starts inside the thinking never leaves it: all of the turn is reasoning
        natural_end = int(min(drawn, max_new) * R.REASONING_SHARE)
        end = len(plan.ids) if plan.loop_start < natural_end else natural_end
        server.output_fault_counts[f"loop_{plan.kind}"] += 1
        server.looping[gen.rid] = (plan.kind, plan.loop_start)
        return replace(gen, output_ids=plan.ids, finish_reason="length", reasoning_end=end)
    if output_fault is OutputFault.LEAK and gen.reasoning == "separate":
        kind = degenerate.leak_kind(seed)
        server.output_fault_counts[f"leak_{kind}"] += 1
        if kind == "think_markers":  # the markers stay in content, the answer after them
            return replace(gen, reasoning="inline")
        # cut at the cap inside the thinking; the parser returns all of it as content
        return replace(gen, output_ids=draw_output_ids(seed, max_new), finish_reason="length", reasoning="leak",
                       reasoning_end=max_new)
    if output_fault is OutputFault.MARKER_ONLY:
        server.output_fault_counts["marker_only"] += 1
        return replace(gen, output_ids=degenerate.marker_only_ids(seed), finish_reason="stop", reasoning="none")
    return gen


def _reasoning_mode(server: SimServer, body: dict[str, Any]) -> str:
    kwargs = body.get("chat_template_kwargs") or {}
    if kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False:
        return "none"
    if server.ns.reasoning_parser and body.get("separate_reasoning", True):
        return "separate"
    return "inline"


def _chat_plan(server: SimServer, body: dict[str, Any]) -> Plan:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects.")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content", ""), str):
            raise BadRequest(f"messages[{i}] must be an object with a string role and string content.")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools must be a list of tool objects.")
    prompt = render_chat(messages, tools=tools)
    sampling = {k: body[k] for k in _SAMPLING_KEYS if k in body}
    seen = {k: body[k] for k in ("temperature", "top_p", "reasoning_effort", "chat_template_kwargs") if k in body}
    server.chat_sampling[orjson.dumps(seen, option=orjson.OPT_SORT_KEYS).decode()] += 1
    max_value = body.get("max_completion_tokens", body.get("max_tokens"))
    plan = _plan(server, _rid(body), prompt, encode(prompt), max_value, "max_tokens", sampling,
                 _reasoning_mode(server, body), bool(body.get("stream")))
    # SGLang 0.5.17 refuses the token ids on a stream (serving_chat.py _validate_request, HTTP 400)
    if plan.stream and body.get("return_prompt_token_ids"):
        raise BadRequest("return_prompt_token_ids is not supported with streaming. "
                         "Please set stream=false when using return_prompt_token_ids=true.")
    if plan.stream and body.get("return_token_ids"):
        raise BadRequest("return_token_ids is not supported with streaming on /v1/chat/completions. "
                         "Please set stream=false when using return_token_ids=true.")
    if plan.stream and body.get("return_meta_info"):  # a ValueError there: serving_base.py handle_request's 400
        raise BadRequest("return_meta_info is not supported with streaming. "
                         "Please set stream=false when using return_meta_info=true.", "BadRequest")
    plan.return_meta_info = bool(body.get("return_meta_info"))
    plan.return_output_ids = bool(body.get("return_token_ids"))
    plan.return_prompt_ids = plan.return_output_ids or bool(body.get("return_prompt_token_ids"))
    options = body.get("stream_options") or {}
    plan.include_usage = bool(options.get("include_usage"))
    plan.continuous_usage = bool(options.get("continuous_usage_stats"))
    plan.user_turns = sum(m.get("role") == "user" for m in messages)
    answered = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if plan.user_turns >= 2 and answered:  # the previous turn's request was everything before its answer
        plan.previous_prompt_tokens = len(encode(render_chat(messages[:answered[-1]], tools=tools)))
    calls = T.requested_calls(body, getattr(server.ns, "tool_call_parser", None), plan.gen.rid)
    if calls and plan.fault is not Fault.EMPTY_TURN and plan.logprobs is None:
        # the model writes its calls then EOS (cut at max_new_tokens: the text so far, no calls parsed)
        ids = encode(T.call_text(calls)) + [R.EOS_TOKEN_ID]
        cut = len(ids) > plan.max_new_tokens
        plan.gen = replace(plan.gen, output_ids=ids[:plan.max_new_tokens], finish_reason="length" if cut else "stop",
                           reasoning="none", reasoning_end=None, tool_calls=() if cut else calls)
        plan.output_fault = OutputFault.NONE
        server.looping.pop(plan.gen.rid, None)
    return plan


def _rid(body: dict[str, Any]) -> str:
    """The caller's rid, or a fresh one."""
    rid = body.get("rid")
    return rid if isinstance(rid, str) else uuid.uuid4().hex


def _generate_plan(server: SimServer, body: dict[str, Any]) -> Plan:
    text, ids = body.get("text"), body.get("input_ids")
    key: str | list[int]
    if isinstance(text, str):
        key, prompt_ids = text, encode(text)
    elif isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        key, prompt_ids = ids, list(ids)
    else:
        raise BadRequest("Provide a single prompt as text (a string) or input_ids (a list of ints); "
                         "batches are not simulated.")
    sampling = dict(body.get("sampling_params") or {})
    # SGLang's SamplingParams default max_new_tokens is 128 (sampling_params.py).
    max_value = sampling.pop("max_new_tokens", 128)
    return _plan(server, _rid(body), key, prompt_ids, max_value, "max_new_tokens", sampling, "none",
                 bool(body.get("stream")), logprob_body=body)


async def chat_completions(request: Request) -> Reply:
    return await _serve(request, _chat_plan, _chat_stream, _chat_whole)


async def generate(request: Request) -> Reply:
    return await _serve(request, _generate_plan, _generate_stream, _generate_whole)


async def _serve(request: Request, make_plan: Any, streamer: Any, whole: Any) -> Reply:
    server: SimServer = request.app.state.sim
    try:
        plan = make_plan(server, await json_body(request))
    except BadRequest as e:
        return error_response(str(e), type_=e.type_)
    early = await _early_fault(server, request, plan)
    if early is not None:
        return early
    try:
        ticket = server.loop.submit(plan.gen.rid, plan.gen.prompt_ids, plan.gen.output_ids,
                                    plan.gen.finish_reason, plan.max_new_tokens, plan.stream)
    except ValueError as e:
        return error_response(str(e))
    if plan.stream:
        return _stream_response(server, plan, streamer(server, plan, ticket))
    if not await wait_or_disconnect(request.receive, ticket.done):
        server.loop.abort(plan.gen.rid)
        return Response(status_code=499)
    return _whole_response(server, plan, whole(server, plan, ticket.done.result()))


async def _early_fault(server: SimServer, request: Request, plan: Plan) -> Response | None:
    """Faults answered before the engine sees the request (None: go on)."""
    fault, faults = plan.fault, server.faults
    if fault is Fault.ERROR:
        return error_response("Simulated server error (--sim-error-rate).", faults.error_status, "InternalServerError")
    if fault is Fault.TOO_MANY:
        return error_response("Simulated overload (--sim-429-rate).", 429, "TooManyRequests")
    if fault is Fault.WRONG_CONTENT_TYPE:
        return Response(_HTML_PAGE, status_code=200, media_type="text/html")
    if fault is Fault.STALL:
        log.info("Simulated stall of %.1f s for request %s", faults.stall_s, plan.gen.rid)
        sleeper = asyncio.ensure_future(asyncio.sleep(faults.stall_s))
        if not await wait_or_disconnect(request.receive, sleeper):
            sleeper.cancel()
            return Response(status_code=499)
    return None


def _whole_response(server: SimServer, plan: Plan, body: dict[str, Any]) -> Reply:
    if plan.fault is Fault.NO_USAGE:
        body.pop("usage", None)
    data = orjson.dumps(body)
    if plan.fault is Fault.BAD_JSON:
        return Response(data[: len(data) // 2], media_type="application/json")
    if plan.fault is Fault.CUT:
        log.info("Simulated connection cut for request %s", plan.gen.rid)
        return ChunkedResponse(one_chunk(data[: len(data) // 2]), media_type="application/json",
                               content_length=len(data), cut=True)
    return ChunkedResponse(one_chunk(data), media_type="application/json", content_length=len(data),
                           on_complete=server.request_completed)


def _stream_response(server: SimServer, plan: Plan, events: AsyncGenerator[bytes, None]) -> ChunkedResponse:
    return ChunkedResponse(_faulty_stream(plan, events), media_type="text/event-stream",
                           cut=plan.fault is Fault.CUT, on_complete=server.request_completed,
                           on_disconnect=lambda: server.loop.abort(plan.gen.rid))


async def _faulty_stream(plan: Plan, events: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Applies CUT (stop after the first event) and BAD_JSON (mangle the first event)."""
    first = True
    try:
        async for event in events:
            if first and plan.fault is Fault.BAD_JSON:
                event = event[: len(event) // 2] + b"\n\n"
            yield event
            if first and plan.fault is Fault.CUT:
                log.info("Simulated connection cut for request %s", plan.gen.rid)
                return
            first = False
    finally:
        await events.aclose()


async def _token_events(ticket: Ticket, interval: int = 1) -> AsyncIterator[tuple[int, int] | Any]:
    """Yields (start, end) token ranges as produced (at least `interval` tokens each: SGLang's
    --stream-interval), then the FinishedRequest."""
    sent, held, tokens = 0, 0, ticket.stream()
    while True:
        item = await tokens.get()
        if isinstance(item, int):
            held += item
            if held >= interval:
                yield sent, sent + held
                sent, held = sent + held, 0
            continue
        if item.completion_tokens > sent:
            yield sent, item.completion_tokens
        yield item
        return


async def _chat_stream(server: SimServer, plan: Plan, ticket: Ticket) -> AsyncIterator[bytes]:
    """SGLang 0.5.17's chat stream (serving_chat.py _generate_chat_stream): a role chunk when the
    first tokens arrive, then reasoning and content chunks, a finish chunk, the usage chunk when
    stream_options.include_usage, and [DONE]."""
    gen, first = plan.gen, True
    named: set[int] = set()  # tool calls whose first piece went out
    async for ev in _token_events(ticket, getattr(server.ns, "stream_interval", 1)):
        if isinstance(ev, tuple):
            if first:
                yield R.sse(R.role_chunk(gen))
                first = False
            usage = R.running_usage(gen, ev[1]) if plan.continuous_usage else None
            if gen.tool_calls:  # the parser turns the call's text into tool_calls pieces
                for piece in T.stream_pieces(gen.tool_calls, ev[0], ev[1], len(gen.output_ids), named):
                    yield R.sse(R.chat_chunk(gen, {"tool_calls": [piece]}, usage=usage))
                continue
            for chunk in R.delta_chunks(gen, ev[0], ev[1], usage):
                yield R.sse(chunk)
            continue
        reason = ev.finish_reason if ev.finish_reason in ("stop", "length") else "abort"
        if reason == "stop" and gen.tool_calls:  # serving_chat.py: a natural stop after calls
            reason = "tool_calls"
        server.count_turn(plan.user_turns, plan.previous_prompt_tokens, ev)
        server.spec.meta_info(gen.prompt_ids, ev.completion_tokens)  # for the gauge: a stream carries no meta_info
        yield R.sse(R.chat_chunk(gen, {}, reason))
        if plan.include_usage and plan.fault is not Fault.NO_USAGE:
            yield R.sse(R.usage_chunk(gen, ev, server.ns.enable_cache_report))
    yield R.sse("[DONE]")


async def _generate_stream(server: SimServer, plan: Plan, ticket: Ticket) -> AsyncIterator[bytes]:
    """SGLang's /generate stream: each event carries the cumulative text so far."""
    gen, text = plan.gen, ""
    async for ev in _token_events(ticket, getattr(server.ns, "stream_interval", 1)):
        if isinstance(ev, tuple):
            text += decode_output(gen.output_ids[ev[0]:ev[1]])
            yield R.sse({"text": text, "meta_info": {"id": gen.rid, "finish_reason": None,
                                                     "prompt_tokens": len(gen.prompt_ids),
                                                     "completion_tokens": ev[1]}})
            continue
        yield R.sse(R.generate_body(gen, ev, text=text, with_ids=False))
    yield R.sse("[DONE]")


def _chat_whole(server: SimServer, plan: Plan, fin: Any) -> dict[str, Any]:
    server.count_turn(plan.user_turns, plan.previous_prompt_tokens, fin)
    body = R.chat_completion(plan.gen, fin, with_usage=True, cache_report=server.ns.enable_cache_report)
    choice = body["choices"][0]  # SGLang's ChatCompletionResponseChoice: each only when asked for
    if plan.return_prompt_ids:
        choice["prompt_token_ids"] = list(plan.gen.prompt_ids)
    if plan.return_output_ids:
        choice["token_ids"] = list(plan.gen.output_ids[:fin.completion_tokens])
    spec = server.spec.meta_info(plan.gen.prompt_ids, fin.completion_tokens)
    if plan.return_meta_info:  # serving_chat.py _build_chat_response: the request's whole meta_info
        choice["meta_info"] = R.generate_body(plan.gen, fin, text="", with_ids=False)["meta_info"] | spec
    return body


def _generate_whole(server: SimServer, plan: Plan, fin: Any) -> dict[str, Any]:
    text = "" if plan.gen.empty else decode_output(plan.gen.output_ids[: fin.completion_tokens])
    body = R.generate_body(plan.gen, fin, text=text, with_ids=True)
    body["meta_info"].update(server.spec.meta_info(plan.gen.prompt_ids, fin.completion_tokens))
    if plan.logprobs is not None:
        body["meta_info"].update(LP.meta_info(plan.logprobs, plan.gen.output_ids[: fin.completion_tokens]))
    return body


async def tokenize(request: Request) -> Response:
    """POST /tokenize (and /v1/tokenize), SGLang 0.5.17's serving_tokenize.py: `messages` through
    the chat template (with the generation prompt) or `prompt` as text -> {tokens, count, max_model_len}."""
    server: SimServer = request.app.state.sim
    try:
        body = await json_body(request)
    except BadRequest as e:
        return error_response(str(e))
    messages, prompt = body.get("messages"), body.get("prompt")
    if (messages is None) == (prompt is None):
        return error_response("Exactly one of 'prompt' or 'messages' must be provided.")
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return error_response("messages must be a list of {role, content} objects.")
        tokens: Any = encode(render_chat(messages))
        count: Any = len(tokens)
    elif isinstance(prompt, str):
        tokens = encode(prompt)
        count = len(tokens)
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens = [encode(p) for p in prompt]
        count = [len(t) for t in tokens]
    else:
        return error_response(f"Invalid prompt type: {type(prompt)}. Expected str or List[str].")
    return JSONResponse({"tokens": tokens, "count": count, "max_model_len": server.info["context_len"]})
