"""SGLang's JSON shapes for the generation endpoints: OpenAI chat completions (whole and as
SSE chunks, python/sglang/srt/entrypoints/openai/protocol.py + serving_chat.py), native
/generate (meta_info), and the error body. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sglang_sim import tools as T
from sglang_sim.engine import FinishedRequest
from sglang_sim.tokenizer import STOP_TOKEN_ID, decode_output

REASONING_SHARE = 0.4  # first 40% of the output tokens are "thinking" when reasoning is on
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# The token id SGLang reports as matched_stop on a normal stop, the last of the output ids.
EOS_TOKEN_ID = STOP_TOKEN_ID


def error_body(message: str, status: int = 400, type_: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's ErrorResponse: {"object": "error", "message", "type", "param", "code"}."""
    return {"object": "error", "message": message, "type": type_, "param": None, "code": status}


@dataclass(frozen=True)
class Generation:
    """What one request will produce. reasoning: "separate" (reasoning_content), "inline"
    (<think>...</think> in content, a server without --reasoning-parser), "none", or "leak" (a
    parser that missed the end marker: the thinking comes back as content, no reasoning_content)."""

    rid: str
    model: str
    created: int
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    reasoning: str = "none"
    empty: bool = False  # the EOS came first (fault empty_turn): no text at all
    reasoning_end: int | None = None  # output tokens of thinking; None: REASONING_SHARE of the output
    tool_calls: tuple[T.Call, ...] = ()  # the answer is these calls (sglang_sim/tools.py): output_ids are their text

    @property
    def reasoning_tokens(self) -> int:
        if self.reasoning == "none":
            return 0
        if self.reasoning_end is not None:
            return min(self.reasoning_end, len(self.output_ids))
        return int(len(self.output_ids) * REASONING_SHARE)

    def split_text(self, start: int, end: int) -> tuple[str, str]:
        """(reasoning text, content text) of output tokens [start, end)."""
        if self.empty:
            return "", ""
        r = self.reasoning_tokens
        reasoning = decode_output(self.output_ids[start:min(end, r)]) if start < r else ""
        content = decode_output(self.output_ids[max(start, r):end]) if end > r else ""
        if self.reasoning == "inline":
            opened = THINK_OPEN if r > 0 and start == 0 else ""
            closed = THINK_CLOSE if start < r <= end else ""
            return "", opened + reasoning + closed + content
        if self.reasoning == "leak":
            return "", reasoning + content
        return reasoning, content


def _finish_reason(fin: FinishedRequest) -> str:
    return fin.finish_reason if fin.finish_reason in ("stop", "length") else "abort"


def usage(gen: Generation, fin: FinishedRequest, cache_report: bool) -> dict[str, Any]:
    """With --enable-cache-report, prompt_tokens_details = {"cached_tokens": N} only when N > 0, else
    null (SGLang 0.5.17 usage_processor.py `_details_if_cached` "keeps JSON slim")."""
    return _usage(gen, fin.prompt_tokens, fin.completion_tokens,
                  {"cached_tokens": fin.cached_tokens} if cache_report and fin.cached_tokens > 0 else None)


def _usage(gen: Generation, prompt: int, completion: int, details: dict[str, Any] | None) -> dict[str, Any]:
    """SGLang 0.5.17's UsageInfo. prompt_tokens_details is filled only with --enable-cache-report
    (serving_chat.py); reasoning_tokens counts the thinking tokens generated so far (the scheduler's
    Req.update_reasoning_tokens), 0 without thinking."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": details, "reasoning_tokens": min(completion, gen.reasoning_tokens)}


def chat_completion(gen: Generation, fin: FinishedRequest, *, with_usage: bool, cache_report: bool) -> dict:
    """The non-streaming /v1/chat/completions body."""
    reasoning, content = gen.split_text(0, fin.completion_tokens)
    reason = _finish_reason(fin)
    calls = None
    if gen.tool_calls and reason == "stop":  # the parser took the calls out of the text (serving_chat.py)
        content, calls, reason = "", T.message_calls(gen.tool_calls), "tool_calls"
    body: dict[str, Any] = {
        "id": gen.rid,
        "object": "chat.completion",
        "created": gen.created,
        "model": gen.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content,
                        "reasoning_content": reasoning if gen.reasoning == "separate" else None,
                        "tool_calls": calls},
            "logprobs": None,
            "finish_reason": reason,
            "matched_stop": EOS_TOKEN_ID if reason == "stop" else None,
        }],
    }
    if with_usage:
        body["usage"] = usage(gen, fin, cache_report)
    return body


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event: b"data: {...}\\n\\n" (or the literal string, e.g. "[DONE]")."""
    payload = obj.encode() if isinstance(obj, str) else orjson.dumps(obj)
    return b"data: " + payload + b"\n\n"


def chat_chunk(gen: Generation, delta: dict[str, Any], finish_reason: str | None = None,
               usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """One chat.completion.chunk as SGLang 0.5.17 writes it (entrypoints/openai/sse_utils.py, msgspec
    with omit_defaults): the delta always carries reasoning_content (null or text) and leaves out a
    role or content that is None; the chunk leaves out usage unless it has one."""
    chunk: dict[str, Any] = {
        "id": gen.rid, "object": "chat.completion.chunk", "created": gen.created, "model": gen.model,
        "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                     "finish_reason": finish_reason,
                     "matched_stop": EOS_TOKEN_ID if finish_reason == "stop" else None}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def role_chunk(gen: Generation) -> dict[str, Any]:
    """The first chunk: role and an empty content, sent when the first tokens arrive."""
    return chat_chunk(gen, {"role": "assistant", "content": ""})


def delta_chunks(gen: Generation, start: int, end: int, continuous_usage: dict[str, Any] | None) -> list[dict]:
    """The chunks carrying output tokens [start, end): SGLang sends the reasoning part and the content
    part of one step as two chunks (serving_chat.py _generate_stream_content); with
    stream_options.continuous_usage_stats each carries the usage so far."""
    reasoning, content = gen.split_text(start, end)
    out = []
    if reasoning:
        out.append(chat_chunk(gen, {"reasoning_content": reasoning}, usage=continuous_usage))
    if content:
        out.append(chat_chunk(gen, {"content": content}, usage=continuous_usage))
    return out


def running_usage(gen: Generation, completion_tokens: int) -> dict[str, Any]:
    """continuous_usage_stats: the usage after `completion_tokens`. prompt_tokens_details stays None
    (SGLang fills it on content chunks with --enable-cache-report; the sim knows cached tokens only
    at the end)."""
    return _usage(gen, len(gen.prompt_ids), completion_tokens, None)


def usage_chunk(gen: Generation, fin: FinishedRequest, cache_report: bool) -> dict[str, Any]:
    """The last data chunk when stream_options.include_usage: empty choices plus usage."""
    return {"id": gen.rid, "object": "chat.completion.chunk", "created": gen.created, "model": gen.model,
            "choices": [], "usage": usage(gen, fin, cache_report)}


def generate_body(gen: Generation, fin: FinishedRequest, *, text: str, with_ids: bool) -> dict[str, Any]:
    """The native /generate body with meta_info (python/sglang/srt/managers/tokenizer_manager.py)."""
    reason = _finish_reason(fin)
    if reason == "stop":
        finish = {"type": "stop", "matched": EOS_TOKEN_ID}
    elif reason == "length":
        finish = {"type": "length", "length": fin.completion_tokens}
    else:
        finish = {"type": "abort", "message": "Abort before finishing."}
    body: dict[str, Any] = {
        "text": text,
        "meta_info": {
            "id": gen.rid,
            "finish_reason": finish,
            "prompt_tokens": fin.prompt_tokens,
            "completion_tokens": fin.completion_tokens,
            "cached_tokens": fin.cached_tokens,
            "num_retractions": fin.retractions,  # SGLang 0.5.17's name (total_retractions before)
            "weight_version": "default",
            "e2e_latency": round(fin.e2e_latency_s, 6),
            "queue_time": round(fin.queue_time_s, 6),
        },
    }
    if with_ids:
        body["output_ids"] = gen.output_ids[: fin.completion_tokens]
    return body
