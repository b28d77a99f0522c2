"""The chat completion wire format, no I/O: `build_request`, and an answer read into a TurnResult chunk by chunk
(`TurnStream`) or whole (`parse_response`), raising Retryable or RequestError (final) for what cannot be written.

SGLang 0.5.17's stream (serving_chat.py _generate_chat_stream): a role chunk, reasoning then content chunks, a
chunk with the finish_reason, the usage chunk (choices empty), `[DONE]`. An abort ends with finish_reason "abort"
or an error object (`{"object": "error", "message", "code"}`) as a data line."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.config.mix import SamplingMix
from gen_pipeline.errors import RequestError
from gen_pipeline.http import Reply
from gen_pipeline.quality import LoopVerdict, RepetitionDetector, tail_loop

# SGLang's stream_options (protocol.py StreamOptions): the usage so far on every chunk, and at the end.
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
# Completion tokens past max_new_tokens by more than this are no count (speculative decoding may accept a
# few draft tokens in the step that reaches the cap): the server's accounting broke, the answer is retried.
USAGE_SLACK_TOKENS = 64
# The loop detector reads a stream's text every this many tokens (and at its end): the same verdict, up to
# this many tokens later, for less client CPU (docs/measurements.md, "Client CPU per 1K streamed tokens").
DETECT_EVERY_TOKENS = 16
_OPTIONAL_SAMPLING = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed",
                      "reasoning_effort", "chat_template_kwargs")


class Retryable(Exception):
    """An attempt failed in a way the next attempt may not: reason + detail for the Failure."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class OtherModel(Exception):
    """The answer names `served`, not the model asked for: its server serves another model now."""

    def __init__(self, served: str):
        super().__init__(served)
        self.served = served


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What one attempt came back with (after answer.judge: what is written)."""

    content: str
    reasoning: str
    finish_reason: str  # "stop" | "length" | "loop" (cut where a loop began: on_loop = "keep")
    prompt_tokens: int
    completion_tokens: int  # decoded when the answer ended (or was aborted)
    reasoning_tokens: int = 0
    prompt_token_ids: list[int] | None = None  # [output] token_ids: the server's, as it returned them
    token_ids: list[int] | None = None
    loop: LoopVerdict | None = None  # the detector fired on this attempt
    rid: str = ""  # the server's request id (the stream chunks' `id`)
    aborted: bool = False  # the stream was closed on the verdict (the server stopped decoding it)
    leak: str = ""  # a LeakReason value: the answer was repaired and kept, flagged
    # the server's parsed tool calls (OpenAI shape, arguments as JSON text: `tool_call_list`); None: none
    tool_calls: list[dict[str, Any]] | None = None
    spec: tuple[float, int] = (0.0, 0)  # meta_info's (spec_accept_length, spec_verify_ct); 0s: none sent


@dataclass(frozen=True, slots=True)
class ClientSettings:
    model: str
    backend: str  # "sglang" | "sim" | "openai" (recorded in meta.backend)
    sampling: SamplingConfig
    generation: GenerationConfig
    kv_cache_dtype: str = "unknown"
    token_ids: bool = False  # [output] token_ids: record the server's ids (turns go unstreamed)
    mix: SamplingMix | None = None  # per-sample variants of `sampling` (config/mix.py); see chat.for_prompt
    variant: int = 0  # which of mix's variants `sampling` is (meta.sampling_variant)
    speculative: bool = False  # the server runs a draft (/server_info speculative_algorithm is set)

    @property
    def streamed(self) -> bool:
        """Turns are streamed (aborted on a loop) while the loop gate is on, unless token ids are recorded:
        a stream costs client CPU on every chunk (docs/measurements.md, "HTTP client library")."""
        return not self.token_ids and self.generation.on_loop != "off"

    @property
    def spec_per_turn(self) -> bool:
        """Each turn records its draft's acceptance: a draft runs and answers come whole (SGLang 0.5.17
        refuses return_meta_info with stream=true, serving_chat.py _convert_to_internal_request)."""
        return self.speculative and not self.streamed


# meta.sampling: once per config, not per sample (asdict is slow on a hot path)
sampling_dict = functools.lru_cache(maxsize=8)(SamplingConfig.as_dict)


@functools.lru_cache(maxsize=8)
def _sampling_body(sampling: SamplingConfig, reasoning: str) -> dict[str, Any]:
    """The body keys a config adds to every request: the optional sampling keys set, then extra_body verbatim."""
    d = sampling.as_dict()
    body: dict[str, Any] = {k: d[k] for k in _OPTIONAL_SAMPLING if k in d}
    if "stop" in body:
        body["stop"] = list(body["stop"])
    body.update(sampling.extra_body)
    if reasoning == "disable":
        # Kimi/DeepSeek templates read `thinking`, Qwen3's `enable_thinking`; unknown keys are ignored.
        body["chat_template_kwargs"] = {**(body.get("chat_template_kwargs") or {}),
                                        "thinking": False, "enable_thinking": False}
    return body


@functools.lru_cache(maxsize=8)
def template_kwargs_text(sampling: SamplingConfig, reasoning: str) -> str:
    """meta.chat_template_kwargs: the request's chat_template_kwargs as JSON text with sorted keys ("{}": none);
    text, so every row has one Arrow type whatever its keys."""
    kwargs = _sampling_body(sampling, reasoning).get("chat_template_kwargs") or {}
    return orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS).decode()


def build_request(messages: list[Any], s: ClientSettings, tools: list[Any] | None = None) -> dict[str, Any]:
    """The JSON body for one chat completion (streamed, or whole with the server's token ids)."""
    body: dict[str, Any] = {
        "model": s.model,
        "messages": messages,
        "max_tokens": s.sampling.max_new_tokens,
        "temperature": s.sampling.temperature,
        "top_p": s.sampling.top_p,
        "stream": s.streamed,
    }
    if s.streamed:
        body["stream_options"] = STREAM_OPTIONS
    else:  # SGLang 0.5.17 protocol.py:778-779 (refused with stream=true, serving_chat.py:914-924)
        body["return_prompt_token_ids"] = body["return_token_ids"] = True
        if s.speculative:  # protocol.py ChatCompletionRequest.return_meta_info: choices[i].meta_info
            body["return_meta_info"] = True
    body.update(_sampling_body(s.sampling, s.generation.reasoning))  # a nested table is shared, never mutated
    if tools:
        body["tools"], body["tool_choice"] = tools, "auto"
    return body


def tool_call_list(calls: Any) -> list[dict[str, Any]] | None:
    """An answer's tool calls in OpenAI's shape, arguments as JSON text (SGLang may send an object), or None."""
    if not calls:
        return None
    if not isinstance(calls, list):
        raise Retryable("bad_response", f"tool_calls is not a list: {_snippet(calls)}")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise Retryable("bad_response", f"a tool call has no function name: {_snippet(call)}")
        args = fn.get("arguments") if isinstance(fn, dict) else None
        args = args if isinstance(args, str) else orjson.dumps(args if args is not None else {}).decode()
        out.append({"id": str(call.get("id") or ""), "type": "function", "function": {"name": name, "arguments": args}})
    return out


def loop_seed(body: bytes, loops: int) -> int:
    """The `seed` of the attempt after a turn's `loops`-th loop (or empty answer): a new draw, reproducible."""
    digest = hashlib.blake2b(body + loops.to_bytes(4, "big"), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF


def error_message(response: Reply) -> str:
    """The server's own error text (OpenAI/SGLang error JSON or the raw body)."""
    text = response.body[:500].decode("utf-8", "replace").strip()
    try:
        data = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        return text or response.reason
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return text


def classify_status(response: Reply) -> None:
    """Raise Retryable for 408/429/5xx, RequestError (final) for other 4xx; pass on 2xx."""
    if response.status >= 300:
        _refused(response.status, error_message(response), "")


def _refused(code: int, message: str, retry_words: str) -> None:
    if code in (408, 429) or code >= 500:
        raise Retryable(f"http_{code}", f"{retry_words}{message}")
    raise RequestError(f"HTTP {code}: {message}", reason=f"http_{code}", retryable=False)


def _error_of(chunk: dict[str, Any]) -> None:
    """A data line that is SGLang's error object (no code: a 500)."""
    err = chunk.get("error", chunk)
    message = str(err.get("message") if isinstance(err, dict) else err)
    code = err.get("code") if isinstance(err, dict) else None
    _refused(_int(code, 500), message, "the server ended the stream with an error: ")


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _check_model(data: dict[str, Any], model: str) -> None:
    """Raise OtherModel when the answer names a model other than `model` ("": not checked). SGLang names the
    request's model (serving_chat.py: model=request.model); others (vLLM, a router) the one they serve."""
    named = data.get("model")
    if model and named and named != model and isinstance(named, str):
        raise OtherModel(named)


def _count(usage: dict[str, Any], key: str, max_tokens: int | None = None) -> int | None:
    """usage[key] (None when absent); raises Retryable when it is not a non-negative int within the cap + slack."""
    v = usage.get(key)
    if v is None:
        return None
    if _int(v, -1) < 0 or (max_tokens is not None and v > max_tokens + USAGE_SLACK_TOKENS):
        cap = f" with max_new_tokens {max_tokens}" if max_tokens is not None else ""
        raise Retryable("bad_response", f"the answer's usage is impossible: {key} = {v!r}{cap}")
    return int(v)


def _snippet(data: Any) -> str:
    return orjson.dumps(data)[:200].decode("utf-8", "replace")


def _finish(finish: Any) -> str:
    if finish in ("stop", "length", "tool_calls"):
        return str(finish)
    return "length" if finish == "max_tokens" else "stop"


def seen_text(deltas: int, completion_tokens: int) -> str:
    """" after N tokens" once text came (a message's tail), else "" (TurnStream, readers.Seen)."""
    return f" after {completion_tokens} tokens" if deltas else ""


class TurnStream:
    """A stream's chunks, fed in order; `feed` returns the detector's verdict (read every `detect_every` tokens)."""

    __slots__ = ("_reasoning", "_content", "detector", "finish_reason", "usage", "deltas",
                 "reasoning_deltas", "tokens_at_last_reasoning", "rid", "model", "max_tokens", "done", "chunks",
                 "empty", "calls", "detect_every", "_unread", "_read_at")

    def __init__(self, detector: RepetitionDetector | None, model: str = "", max_tokens: int | None = None, *,
                 detect_every: int = DETECT_EVERY_TOKENS) -> None:
        self.model, self.max_tokens = model, max_tokens  # what the chunks must name, the request's cap
        self.detector, self.detect_every = detector, detect_every
        self._unread: list[str] = []  # text deltas the detector has not read yet
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._read_at = self.chunks = self.deltas = self.reasoning_deltas = 0  # deltas: text deltas seen
        self.done = False  # `[DONE]` came: the server ended the answer
        self.empty: Any = None  # the latest chunk with no choices (what came back, for a message)
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None  # the latest usage seen (continuous or final)
        self.tokens_at_last_reasoning: int | None = None  # completion tokens when the last reasoning came
        self.rid = ""  # the chunks' `id`: SGLang's request id (its log's rid)
        self.calls: dict[int, dict[str, Any]] = {}  # streamed tool calls by index: id, name, argument pieces

    def feed_data(self, data: bytes) -> LoopVerdict | None:
        """One event's data (JSON bytes, or `[DONE]`: sets `done`), as `feed`."""
        if data == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise Retryable("bad_response", "a stream chunk is not JSON") from None
        return self.feed(chunk)

    def feed(self, chunk: Any) -> LoopVerdict | None:
        if not isinstance(chunk, dict):
            raise Retryable("bad_response", "a stream chunk is not a JSON object")
        if not self.rid:
            self.rid = str(chunk.get("id") or "")
        _check_model(chunk, self.model)
        self.chunks += 1
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if choices is None and (chunk.get("object") == "error" or "error" in chunk):
                _error_of(chunk)
            self.empty = chunk
            return None
        try:
            choice = choices[0]
            delta = choice.get("delta") or {}
            reasoning, content = delta.get("reasoning_content"), delta.get("content")
            finish = choice.get("finish_reason")
            if delta.get("tool_calls"):
                self._feed_calls(delta["tool_calls"])
        except (AttributeError, IndexError, KeyError, TypeError):
            raise Retryable("bad_response", "a stream chunk has no choices[0].delta") from None
        if reasoning:
            self._reasoning.append(reasoning)
            self.deltas += 1
            self.reasoning_deltas += 1
            if usage is not None:
                self.tokens_at_last_reasoning = _int(usage.get("completion_tokens"), -1)
            if self.detector is not None:
                self._unread.append(reasoning)
        if content:
            self._content.append(content)
            self.deltas += 1
            if self.detector is not None:
                self._unread.append(content)
        if finish:
            self.finish_reason = finish
        if self._unread and (finish or self.completion_tokens - self._read_at >= self.detect_every):
            return self._detect()
        return None

    def _detect(self) -> LoopVerdict | None:
        assert self.detector is not None
        unread, self._unread = self._unread, []
        self._read_at = self.completion_tokens
        return self.detector.feed(unread[0] if len(unread) == 1 else "".join(unread))

    def detect_end(self) -> LoopVerdict | None:
        """The stream ended: the detector reads what is left and the held-back last word."""
        if self.detector is None:
            return None
        verdict = self._detect() if self._unread else None
        return verdict if verdict is not None else self.detector.finish()

    def _feed_calls(self, pieces: Any) -> None:
        """delta.tool_calls: a call's first piece names it (id, name), the next ones (same index) carry arguments
        (serving_chat.py _process_tool_call_stream)."""
        for piece in pieces:
            fn = piece.get("function") or {}
            index = _int(piece.get("index"), len(self.calls))
            call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": []})
            call["id"] = call["id"] or str(piece.get("id") or "")
            call["name"] = call["name"] or str(fn.get("name") or "")
            args = fn.get("arguments")
            if args:
                call["arguments"].append(args if isinstance(args, str) else orjson.dumps(args).decode())
            self.deltas += 1

    @property
    def completion_tokens(self) -> int:
        """Tokens decoded so far: the usage's count when the server sends it, else the deltas counted."""
        return _int(self.usage.get("completion_tokens"), self.deltas) if self.usage else self.deltas

    def seen(self) -> str:
        return seen_text(self.deltas, self.completion_tokens)

    def result(self, *, loop: LoopVerdict | None = None, aborted: bool = False) -> TurnResult:
        """The attempt's answer (`aborted`: closed on `loop`); raises Retryable for a cut or usage-less stream."""
        reasoning, content = "".join(self._reasoning), "".join(self._content)
        if not aborted:
            if self.finish_reason is None and self.empty is not None and not self.deltas:
                raise Retryable("bad_response", f"the server answered 200 with no choices ({self.chunks} chunks; "
                                                f"the last: {_snippet(self.empty)})")
            if self.finish_reason is None and self.done:
                raise Retryable("bad_response", "the answer ended ([DONE]) with no finish_reason "
                                                f"({self.completion_tokens} tokens decoded)")
            if self.finish_reason is None:
                raise Retryable("connection", f"the stream ended before the answer did ({self.completion_tokens} "
                                              "tokens decoded)")
            if self.finish_reason == "abort":
                raise Retryable("aborted", f"the server aborted the request after {self.completion_tokens} tokens")
            if self.usage is None:
                raise Retryable("bad_response", "the stream carried no usage (token counts)")
        usage = self.usage or {}
        prompt_tokens = _count(usage, "prompt_tokens") or 0
        completion = _count(usage, "completion_tokens", self.max_tokens)
        completion = completion if completion is not None else self.deltas
        reasoning_tokens = _int(usage.get("reasoning_tokens"), -1)
        if reasoning_tokens < 0:  # not SGLang: counted where the reasoning ended
            at = self.tokens_at_last_reasoning
            reasoning_tokens = at if at is not None and at >= 0 else self.reasoning_deltas
        finish = "length" if aborted else _finish(self.finish_reason)
        if loop is None and finish == "length" and self.detector is not None:  # at the cap: the tail once more
            loop = tail_loop(reasoning + content, self.detector.thresholds)
        calls = tool_call_list([{"id": c["id"], "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                                for _, c in sorted(self.calls.items())])
        return TurnResult(content, reasoning, finish, prompt_tokens, completion, min(reasoning_tokens, completion),
                          loop=loop, aborted=aborted, rid=self.rid, tool_calls=calls)


def parse_response(data: Any, *, token_ids: bool = False, model: str = "", max_tokens: int | None = None,
                   content_type: str = "") -> TurnResult:
    """The fields we keep from a whole chat completion (parsed, or its body's bytes; token_ids: the server's ids
    too); raises Retryable when it is malformed or its usage impossible (`max_tokens`: the cap), OtherModel when it
    names another `model`."""
    if isinstance(data, bytes):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise Retryable("bad_response", f"body is not JSON (content-type {content_type or '?'})") from None
    if isinstance(data, dict):
        _check_model(data, model)
        if data.get("choices") == []:
            raise Retryable("bad_response", f"the answer had no choices: {_snippet(data)}")
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or ""
        calls = tool_call_list(message.get("tool_calls"))
        finish = choice.get("finish_reason")
        usage = data.get("usage")
        if not isinstance(usage, dict):
            raise Retryable("bad_response", "the response has no usage (token counts)")
        prompt_tokens = _count(usage, "prompt_tokens")
        completion_tokens = _count(usage, "completion_tokens", max_tokens)
        if prompt_tokens is None or completion_tokens is None:
            raise Retryable("bad_response", f"the answer's usage has no token counts: {_snippet(usage)}")
        ids: tuple[list[int] | None, list[int] | None] = (None, None)
        if token_ids:
            ids = choice.get("prompt_token_ids"), choice.get("token_ids")
            if not all(isinstance(x, list) for x in ids):
                raise Retryable("bad_response", "the response has no prompt_token_ids / token_ids (return_token_ids "
                                                "needs SGLang 0.5.13 or later)")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise Retryable("bad_response", f"unexpected response shape ({type(e).__name__}: {e})") from None
    if not isinstance(content, str) or not isinstance(reasoning, str):
        raise Retryable("bad_response", "message content is not a string")
    if finish == "abort":
        raise Retryable("aborted", "the server aborted the request")
    reasoning_tokens = _int(usage.get("reasoning_tokens"), -1)
    if reasoning_tokens < 0:  # not SGLang: the reasoning's share of the text
        chars = len(reasoning) + len(content)
        reasoning_tokens = round(completion_tokens * len(reasoning) / chars) if chars else 0
    return TurnResult(content, reasoning, _finish(finish), prompt_tokens, completion_tokens,
                      min(reasoning_tokens, completion_tokens), prompt_token_ids=ids[0], token_ids=ids[1],
                      rid=str(data.get("id") or ""), tool_calls=calls, spec=_spec(choice.get("meta_info")))


def _spec(meta: Any) -> tuple[float, int]:
    """(spec_accept_length, spec_verify_ct) of a meta_info (SGLang 0.5.17 tokenizer_manager.py
    _calculate_spec_decoding_metrics sets them only when spec_verify_ct > 0); (0.0, 0) otherwise."""
    meta = meta if isinstance(meta, dict) else {}
    length, verify_ct = meta.get("spec_accept_length"), _int(meta.get("spec_verify_ct"))
    ok = isinstance(length, int | float) and not isinstance(length, bool) and verify_ct > 0
    return (float(length), verify_ct) if ok else (0.0, 0)
