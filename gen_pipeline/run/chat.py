"""The HTTP client: one conversation in, one regenerated Sample (or a Failure) out.

Talks to `/v1/chat/completions` (SGLang, an sglang-router, or any OpenAI-compatible
server). Every assistant turn is regenerated in order, each request carrying the
regenerated history. Retries (tenacity, exponential backoff with jitter) cover connection
errors, timeouts, 429, 5xx and unreadable bodies; a 4xx that will fail again (e.g. a prompt
longer than the context) is not retried and becomes a Failure with the server's message.

Requests go through gen_pipeline/http.py (httpx, the product's one HTTP library). A connection that
cannot be made (refused, unknown host, a black-holed server: connect timeout) or that is lost counts
toward taking a server out of a fleet; a read timeout does not (the server is there, only busy).

A server that went away (connection refused or lost, or taken out of the fleet as hung, which cancels
the requests in flight to it) is not a failed request when the servers are watched (a `gate`): the
request is sent again, to another server at once, or after the pause for one to come back, without
spending one of its max_attempts and without a Failure. It gives up only when the same request found
no server for `server_wait_s` outside those pauses (the fleet watch ends the run first when none
answers that long). A client alone (no gate) counts them as attempts.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.config.server import normalise_server_url
from gen_pipeline.errors import RequestError
from gen_pipeline.http import CannotConnect, ConnectionLost, Http, HttpError, Reply
from gen_pipeline.records import Failure, Message, Prompt, Sample
from gen_pipeline.server.fleet import Fleet

log = logging.getLogger(__name__)

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_JSON = {"content-type": "application/json"}


class _ServerGone(Exception):
    """The server went away under a request (refused, lost, taken out): send it again; `why` says how."""

    def __init__(self, url: str, why: str):
        super().__init__(why)
        self.url, self.why = url, why


GONE_PAUSE_S = 0.5  # before sending again to a server that went away (its health checks then pause dispatch)


class _Retryable(Exception):
    """An attempt failed in a way the next attempt may not: reason + detail for the Failure."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientSettings:
    model: str
    backend: str  # "sglang" | "sim" | "openai" (recorded in meta.backend)
    sampling: SamplingConfig
    generation: GenerationConfig
    kv_cache_dtype: str = "unknown"

    @property
    def sampling_dict(self) -> dict[str, Any]:
        return _sampling_dict(self.sampling)


@dataclass(frozen=True, slots=True)
class TurnResult:
    content: str
    reasoning: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


RequestDone = Callable[[int, int, float], None]  # (prompt_tokens, completion_tokens, latency_s)


# ---------------------------------------------------------------- pure request/response handling

@functools.lru_cache(maxsize=8)
def _sampling_dict(sampling: SamplingConfig) -> dict[str, Any]:
    return sampling.as_dict()  # once per config, not per sample (asdict is slow on a hot path)


@functools.lru_cache(maxsize=8)
def _sampling_body(sampling: SamplingConfig, reasoning: str) -> dict[str, Any]:
    """The body keys a config adds to every request: the optional sampling keys that are set (as
    SGLang's ChatCompletionRequest names them), then extra_body verbatim; cached per config."""
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


_OPTIONAL_SAMPLING = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed")


def build_request(messages: list[Message], s: ClientSettings) -> dict[str, Any]:
    """The JSON body for one chat completion."""
    body: dict[str, Any] = {
        "model": s.model,
        "messages": messages,
        "max_tokens": s.sampling.max_new_tokens,
        "temperature": s.sampling.temperature,
        "top_p": s.sampling.top_p,
        "stream": False,
    }
    extra = _sampling_body(s.sampling, s.generation.reasoning)
    if extra:
        body.update(extra)  # copied: a nested table in extra_body is shared, never mutated
    return body


def split_think(content: str) -> tuple[str, str]:
    """("reasoning", "answer") from content that still carries <think> markers (no reasoning parser)."""
    if _THINK_CLOSE not in content:
        return "", content.replace(_THINK_OPEN, "")
    head, _, tail = content.partition(_THINK_CLOSE)
    return head.replace(_THINK_OPEN, "").strip(), tail.lstrip()


def parse_response(data: Any) -> TurnResult:
    """Read the fields we keep from a chat completion; raises _Retryable when it is malformed."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or ""
        finish = choice.get("finish_reason")
        usage = data.get("usage")
        if not isinstance(usage, dict):
            raise _Retryable("bad_response", "the response has no usage (token counts)")
        prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    except _Retryable:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise _Retryable("bad_response", f"unexpected response shape ({type(e).__name__}: {e})") from None
    if not isinstance(content, str) or not isinstance(reasoning, str):
        raise _Retryable("bad_response", "message content is not a string")
    if finish == "abort":
        raise _Retryable("aborted", "the server aborted the request")
    if finish not in ("stop", "length"):
        finish = "length" if finish == "max_tokens" else "stop"
    if _THINK_OPEN in content or _THINK_CLOSE in content:
        extra, content = split_think(content)
        reasoning = (reasoning + "\n" + extra).strip() if reasoning else extra
    return TurnResult(content, reasoning, finish, prompt_tokens, completion_tokens)


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
    """Raise _Retryable for 408/429/5xx, RequestError (final) for other 4xx; pass on 2xx."""
    code = response.status
    if code < 300:
        return
    message = error_message(response)
    if code in (408, 429) or code >= 500:
        raise _Retryable(f"http_{code}", message)
    raise RequestError(f"HTTP {code}: {message}", reason=f"http_{code}", retryable=False)


def build_sample(prompt: Prompt, dataset: str, conversation: list[Message], turns: list[TurnResult],
                 s: ClientSettings) -> Sample:
    finish = "length" if any(t.finish_reason == "length" for t in turns) else "stop"
    meta = {
        "model": s.model,
        "backend": s.backend,
        "finish_reason": finish,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "completion_tokens": sum(t.completion_tokens for t in turns),
        "turns": len(turns),
        "sampling": s.sampling_dict,
        "kv_cache_dtype": s.kv_cache_dtype,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return Sample(id=prompt.id, dataset=dataset, conversations=conversation, meta=meta)


# ---------------------------------------------------------------- the async client

class ChatClient:
    """Regenerates conversations against one or more servers (the fleet picks each request's server)."""

    def __init__(self, http: Http, base_urls: list[str], settings: ClientSettings, *,
                 gate: Callable[[], Awaitable[None]] | None = None, on_request_done: RequestDone | None = None,
                 fleet: Fleet | None = None, server_wait_s: float = 600.0):
        self._http = http
        self._fleet = fleet if fleet is not None else Fleet([normalise_server_url(u) for u in base_urls])
        self.settings = settings
        self._gate = gate
        self._on_done = on_request_done
        self.server_wait_s = server_wait_s
        self.resent = 0  # requests sent again because their server went away
        self._sent: dict[str, set[anyio.CancelScope]] = {}  # url → its requests in flight
        self._fleet.on_taken_out.append(self._cancel_sent_to)

    def _cancel_sent_to(self, url: str) -> None:
        """The fleet took `url` out: its requests in flight end now and are sent again (_send)."""
        for scope in self._sent.get(url, ()):
            scope.cancel()

    async def regenerate(self, prompt: Prompt, dataset: str) -> Sample | Failure:
        """Every assistant turn regenerated in order; per-request failures come back as a Failure."""
        s = self.settings
        conversation: list[Message] = []
        turns: list[TurnResult] = []
        keep_reasoning = s.generation.reasoning == "keep"
        for m in prompt.messages:
            if m["role"] == "assistant":
                continue  # source answers are replaced by the target model's
            conversation.append({"role": m["role"], "content": m["content"]})
            if m["role"] != "user":
                continue
            try:
                turn = await self.complete(conversation)
            except RequestError as e:
                return Failure(prompt.id, dataset, e.reason, str(e), attempts=e.attempts, retryable=e.retryable)
            reply: Message = {"role": "assistant", "content": turn.content}
            if keep_reasoning:
                reply["reasoning_content"] = turn.reasoning
            conversation.append(reply)
            turns.append(turn)
            if turn.finish_reason == "length":
                if s.generation.truncated == "drop":
                    return Failure(prompt.id, dataset, "truncated",
                                   f"turn {len(turns)} hit max_new_tokens={s.sampling.max_new_tokens}",
                                   retryable=False)
                break  # a cut answer ends the conversation: later turns would build on it
        return build_sample(prompt, dataset, conversation, turns, s)

    async def complete(self, messages: list[Message]) -> TurnResult:
        """One chat completion with retries; raises RequestError (with the attempts made) when it
        will not succeed."""
        g = self.settings.generation
        body = orjson.dumps(build_request(messages, self.settings))
        attempts = 1
        try:
            return await self._send(body)  # the common case pays nothing for the retry machinery
        except _Retryable as e:
            if g.max_attempts == 1:
                raise RequestError(f"gave up after 1 attempt: {e}", reason=e.reason, attempts=1) from None
        except RequestError as e:
            e.attempts = attempts
            raise
        # "Full jitter" (AWS): wait uniform(0, min(max, initial * 2**n)) before attempt n+1, which
        # spreads a burst of retries out; the first wait here, the rest in tenacity's loop.
        await anyio.sleep(random.uniform(0, g.retry_initial_wait_s))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(g.max_attempts - 1),
            wait=wait_random_exponential(multiplier=2 * g.retry_initial_wait_s, max=g.retry_max_wait_s),
            retry=retry_if_exception_type(_Retryable),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    return await self._send(body)
        except _Retryable as e:
            raise RequestError(f"gave up after {g.max_attempts} attempts: {e}", reason=e.reason,
                               attempts=attempts) from None
        except RequestError as e:
            e.attempts = attempts
            raise
        raise AssertionError("unreachable")

    async def _send(self, body: bytes) -> TurnResult:
        """One attempt, sent again while its server went away (not an attempt spent, not a failure)."""
        gone_since: float | None = None
        while True:
            if self._gate is not None:
                paused = time.monotonic()
                await self._gate()  # blocks while the supervisor restarts the server (or none answers)
                if gone_since is not None:  # a pause the watch bounds itself is not this request's wait
                    gone_since += time.monotonic() - paused
            try:
                return await self._attempt(body)
            except _ServerGone as e:
                now = time.monotonic()
                gone_since = gone_since if gone_since is not None else now
                if now - gone_since >= self.server_wait_s:
                    raise _Retryable("server_gone", f"no server took it for {self.server_wait_s:g} s "
                                                    f"(latest: {e.why})") from None
                self.resent += 1
                if self._fleet.is_up(e.url) or not self._fleet.up_urls:
                    # no other server to send it to: pause (jittered) while the health checks catch up
                    await anyio.sleep(random.uniform(0.5, 1.0) * GONE_PAUSE_S)

    async def _attempt(self, body: bytes) -> TurnResult:
        fleet = self._fleet
        url = fleet.pick()
        fleet.started(url)
        started = time.monotonic()
        scopes = self._sent.setdefault(url, set())
        with anyio.CancelScope() as scope:
            scopes.add(scope)
            try:
                response = await self._http.post_json(f"{url}/v1/chat/completions", body)
            except HttpError as e:
                if isinstance(e, CannotConnect | ConnectionLost):  # not NoAnswer: a slow server is still there
                    fleet.why[url] = e.why
                    self._connection_failed(url)
                    # the servers are watched: wait for one, not an attempt; a connection cut (a flaky
                    # server or proxy cuts one answer) only once the server is out (cut again and again)
                    if self._gate is not None and (isinstance(e, CannotConnect) or not fleet.is_up(url)):
                        raise _ServerGone(url, e.why) from None
                raise _Retryable(e.kind, str(e)) from None
            finally:
                fleet.finished(url)
                scopes.discard(scope)
        if scope.cancelled_caught:  # taken out meanwhile (hung): its answer will never be read
            if self._gate is None:
                raise _Retryable("server_gone", f"{url} was taken out of the fleet")
            raise _ServerGone(url, "taken out of the fleet")
        fleet.succeeded(url, time.monotonic())
        classify_status(response)
        try:
            data = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise _Retryable("bad_response",
                             f"body is not JSON (content-type {response.content_type or '?'})") from None
        turn = parse_response(data)
        if self._on_done is not None:
            self._on_done(turn.prompt_tokens, turn.completion_tokens, time.monotonic() - started)
        if not turn.content.strip():
            _reject_empty(turn, self.settings.generation.empty_turn)
        return turn

    def _connection_failed(self, url: str) -> None:
        """After fail_after connection failures in a row the server is taken out of the fleet (a server
        alone too when the servers are watched, `gate`: none up pauses dispatch until its health checks
        bring it back)."""
        fleet = self._fleet
        if (len(fleet.urls) > 1 or self._gate is not None) and fleet.failed(url, time.monotonic()):
            log.warning("took %s out after %d connection errors in a row; %d of %d servers left, probing it "
                        "back with backoff", url, fleet.fail_after, len(fleet.up_urls), len(fleet.urls))


def _reject_empty(turn: TurnResult, policy: str) -> None:
    """An empty assistant turn is never written (validate rejects it): "retry" makes it a
    retryable attempt (RequestError once max_attempts are spent), "fail" a failure at once."""
    detail = (f"the assistant turn is empty ({turn.completion_tokens} completion tokens, "
              f"finish_reason {turn.finish_reason})")
    if policy == "fail":
        raise RequestError(detail, reason="empty_turn", retryable=False)
    raise _Retryable("empty_turn", detail)

