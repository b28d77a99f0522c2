"""The HTTP client: one conversation in, one regenerated Sample (or a Failure) out.

Talks to `/v1/chat/completions` (SGLang, an sglang-router, or any OpenAI-compatible
server). Every assistant turn is regenerated in order, each request carrying the
regenerated history. Retries (tenacity, exponential backoff with jitter) cover connection
errors, timeouts, 429, 5xx and unreadable bodies; a 4xx that will fail again (e.g. a prompt
longer than the context) is not retried and becomes a Failure with the server's message.

The quality gate (issue 22; gen_pipeline/quality, run/answer.py): every turn is streamed (SSE, with
`stream_options.include_usage` and `continuous_usage_stats`, so the token count at any moment is the
server's) and one RepetitionDetector per turn is fed the reasoning then the content deltas as they
arrive. When it fires the stream is closed: SGLang 0.5.17 aborts a request whose client went away
and frees its KV at once (the cancelled generator's `except BaseException` in
managers/tokenizer_manager.py generate_request → _discard_pending_req_states sends AbortReq;
serving_chat.py's create_abort_task repeats it 2 s later). `[generation] on_loop` decides the turn:
"retry" with a new `seed` at once (no backoff: the server is fine), a final Failure (reason `loop`)
once max_attempts are spent; "drop" a final Failure at once; "keep" the text cut where the loop began
(answer.cut_at_loop). A finished turn is judged (answer.judge): empty or marker-only answers follow
`empty_turn`, reasoning leaks `truncated`. With `[output] token_ids = true` turns are not streamed
(SGLang refuses return_token_ids on a stream) and the detector reads the finished text. A server
that answers a streamed request in one piece (JSON) is read the same way.

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
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.config.mix import SamplingMix
from gen_pipeline.config.server import normalise_server_url
from gen_pipeline.errors import RequestError
from gen_pipeline.http import BadStatus, CannotConnect, ConnectionLost, Http, HttpError, Reply
from gen_pipeline.quality import RepetitionDetector
from gen_pipeline.records import Failure, Message, Prompt, Sample, TurnMeta
from gen_pipeline.run.answer import (
    Retryable,
    TurnResult,
    TurnStats,
    TurnStream,
    cut_at_loop,
    detect_loop,
    judge,
    parse_response,
    split_think,
)
from gen_pipeline.server.fleet import Fleet

log = logging.getLogger(__name__)
JOURNAL = logging.getLogger("gen_pipeline.journal.gate")  # run.log only (cli/logs.py)

_Retryable = Retryable  # the name tests and older callers use
__all__ = ["ChatClient", "ClientSettings", "RequestDone", "TurnResult", "build_request", "build_sample",
           "classify_status", "error_message", "parse_response", "split_think"]
# SGLang's stream_options (protocol.py StreamOptions): the usage chunk at the end, and the usage so far on
# every chunk (the tokens decoded when a loop is aborted, and a stream cut mid-way, are the server's count).
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


class _ServerGone(Exception):
    """The server went away under a request (refused, lost, taken out): send it again; `why` says how."""

    def __init__(self, url: str, why: str):
        super().__init__(why)
        self.url, self.why = url, why


GONE_PAUSE_S = 0.5  # before sending again to a server that went away (its health checks then pause dispatch)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    model: str
    backend: str  # "sglang" | "sim" | "openai" (recorded in meta.backend)
    sampling: SamplingConfig
    generation: GenerationConfig
    kv_cache_dtype: str = "unknown"
    token_ids: bool = False  # [output] token_ids: record the server's ids (turns go unstreamed)
    mix: SamplingMix | None = None  # per-sample variants of `sampling` (config/mix.py); see for_prompt
    variant: int = 0  # which of mix's variants `sampling` is (meta.sampling_variant)

    @property
    def sampling_dict(self) -> dict[str, Any]:
        return _sampling_dict(self.sampling)

    @property
    def streamed(self) -> bool:
        """Turns are streamed (and aborted on a loop) while the loop gate is on, unless the server's token
        ids are recorded. With on_loop = "off" nothing watches the stream, so turns come whole: a stream
        costs the client ~50 ms of CPU per 1,000 tokens at SGLang's default stream interval
        (docs/measurements.md, issue 22)."""
        return not self.token_ids and self.generation.on_loop != "off"


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


_OPTIONAL_SAMPLING = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed",
                      "reasoning_effort", "chat_template_kwargs")


def for_prompt(s: ClientSettings, prompt: Prompt) -> ClientSettings:
    """The settings of one sample: its variant of the sampling mix, drawn from its place in the source."""
    if s.mix is None:
        return s
    variant = s.mix.pick(prompt.id, prompt.source_index)
    return replace(s, sampling=s.mix.variants[variant].sampling, variant=variant)


def thinks(s: ClientSettings) -> bool:
    """Whether this sample's answers should carry reasoning (the leak checks' expectation): the dataset keeps
    it and the sample's sampling does not turn thinking off (chat_template_kwargs, e.g. a mix's variant)."""
    if s.generation.reasoning != "keep":
        return False
    for kwargs in (s.sampling.chat_template_kwargs, s.sampling.extra_body.get("chat_template_kwargs")):
        if isinstance(kwargs, dict) and (kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False):
            return False
    return True


def build_request(messages: list[Message], s: ClientSettings) -> dict[str, Any]:
    """The JSON body for one chat completion: streamed with the usage on every chunk, or (token_ids)
    whole with the server's prompt and output token ids. A pure function of its arguments."""
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
    extra = _sampling_body(s.sampling, s.generation.reasoning)
    if extra:
        body.update(extra)  # copied: a nested table in extra_body is shared, never mutated
    return body


def loop_seed(body: bytes, loops: int) -> int:
    """The `seed` of the attempt after the `loops`-th loop of a turn: a new draw (a model that looped
    once at this seed would loop again), reproducible (a function of the request and the count)."""
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
    """Raise _Retryable for 408/429/5xx, RequestError (final) for other 4xx; pass on 2xx."""
    code = response.status
    if code < 300:
        return
    message = error_message(response)
    if code in (408, 429) or code >= 500:
        raise _Retryable(f"http_{code}", message)
    raise RequestError(f"HTTP {code}: {message}", reason=f"http_{code}", retryable=False)


def build_sample(prompt: Prompt, dataset: str, conversation: list[Message], turns: list[TurnResult],
                 s: ClientSettings, per_turn: list[TurnMeta] | None = None) -> Sample:
    """The sample's row. meta.finish_reason: "loop" when a turn was cut where a loop began (on_loop =
    "keep"), else "length" when one hit max_new_tokens, else "stop"; meta.per_turn: records.TurnMeta."""
    reasons = {t.finish_reason for t in turns}
    finish = "loop" if "loop" in reasons else "length" if "length" in reasons else "stop"
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
        "per_turn": per_turn if per_turn is not None else [TurnStats(attempts=1).meta(t) for t in turns],
    }
    if s.mix is not None:  # only under a mix (part of the fingerprint): rows without one keep their keys
        meta["sampling_variant"] = s.variant
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
        """Every assistant turn regenerated in order; per-request failures come back as a Failure (with the
        gate's counts of the sample's turns in `extra`)."""
        try:
            return await self._regenerate(prompt, dataset)
        finally:
            self._fleet.sample_ended((dataset, prompt.id))  # its turns' server is no longer needed

    async def _regenerate(self, prompt: Prompt, dataset: str) -> Sample | Failure:
        s = for_prompt(self.settings, prompt)
        conversation: list[Message] = []  # what is written
        history: list[Message] = []  # what the next request sends (no token ids)
        turns: list[TurnResult] = []
        per_turn: list[TurnMeta] = []
        spent = TurnStats()  # the turns so far, for a Failure's record
        keep_reasoning = s.generation.reasoning == "keep"
        for m in prompt.messages:
            if m["role"] == "assistant":
                continue  # source answers are replaced by the target model's
            conversation.append({"role": m["role"], "content": m["content"]})
            history.append(conversation[-1])
            if m["role"] != "user":
                continue
            stats = TurnStats()
            try:
                turn = await self.complete(history, s, stats, sample=(dataset, prompt.id))
            except RequestError as e:
                _journal_loops(stats, prompt.id, dataset)
                spent.add(stats)
                return Failure(prompt.id, dataset, e.reason, str(e), attempts=e.attempts, retryable=e.retryable,
                               extra=spent.failure_extra())
            _journal_loops(stats, prompt.id, dataset)
            spent.add(stats)
            reply: Message = {"role": "assistant", "content": turn.content}
            if keep_reasoning:
                reply["reasoning_content"] = turn.reasoning
            history.append(reply)
            if s.token_ids and turn.prompt_token_ids is not None and turn.token_ids is not None:
                # the server's ids on the written turn (export/tokens.py reads them); not sent back
                reply = {**reply, "prompt_token_ids": turn.prompt_token_ids, "token_ids": turn.token_ids}  # type: ignore[dict-item]
            conversation.append(reply)
            turns.append(turn)
            per_turn.append(stats.meta(turn))
            if turn.finish_reason == "length" and not turn.leak and s.generation.truncated == "drop":
                return Failure(prompt.id, dataset, "truncated",
                               f"turn {len(turns)} hit max_new_tokens={s.sampling.max_new_tokens}",
                               retryable=False, extra=spent.failure_extra())
            if turn.finish_reason != "stop":
                break  # a cut answer ends the conversation: later turns would build on it
        return build_sample(prompt, dataset, conversation, turns, s, per_turn)

    async def complete(self, messages: list[Message], settings: ClientSettings | None = None,
                       stats: TurnStats | None = None, sample: Hashable | None = None) -> TurnResult:
        """One assistant turn: attempts with retries and the gate's policies; raises RequestError (with the
        attempts made) when it will not succeed. `stats` (filled in place) counts the attempts, loops,
        empty answers and the tokens they decoded or saved. `sample`: the conversation it belongs to (the
        fleet keeps its turns together)."""
        s = settings or self.settings
        stats = stats if stats is not None else TurnStats()
        g = s.generation
        base = build_request(messages, s)
        state = _Attempts(s, orjson.dumps(base), base, stats, sample)
        try:
            return await self._attempt(state)  # the common case pays nothing for the retry machinery
        except _Retryable as e:
            if g.max_attempts == 1:
                raise _gave_up(e, 1) from None
        except RequestError as e:
            e.attempts = stats.attempts
            raise
        retrying = AsyncRetrying(stop=stop_after_attempt(g.max_attempts - 1), wait=functools.partial(_wait, g),
                                 retry=retry_if_exception_type(_Retryable), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(state)
        except _Retryable as e:
            raise _gave_up(e, stats.attempts) from None
        except RequestError as e:
            e.attempts = stats.attempts
            raise
        raise AssertionError("unreachable")

    async def _attempt(self, state: _Attempts) -> TurnResult:
        """One request, then the gate: a loop per on_loop (retry: the next attempt's seed changes), a
        finished answer judged. Raises _Retryable / RequestError."""
        s, stats = state.settings, state.stats
        g = s.generation
        stats.attempts += 1
        turn = await self._send(state)
        if turn.loop is None:
            try:
                return judge(turn, g, thinks(s))
            except _Retryable as e:  # an empty answer: its tokens were decoded for nothing
                stats.empty += e.reason == "empty_turn"
                stats.discarded_tokens += turn.completion_tokens
                raise
        stats.loops += 1
        if turn.aborted:
            stats.tokens_not_decoded += max(0, s.sampling.max_new_tokens - turn.completion_tokens)
        v = turn.loop
        what = (f"the turn looped ({v.reason.value}, period {v.period_words} words) from character "
                f"{v.loop_start_char}; {'aborted' if turn.aborted else 'caught'} after {turn.completion_tokens} tokens")
        stats.caught.append(f"request {turn.rid or '?'}: {what} (on_loop {g.on_loop})")
        if g.on_loop == "keep":
            try:  # the text before the loop, judged as any answer (think markers split off, leaks flagged)
                kept = judge(cut_at_loop(turn, v), g, thinks(s))
            except (_Retryable, RequestError) as e:
                stats.discarded_tokens += turn.completion_tokens
                if isinstance(e, RequestError) and e.reason != "empty_turn":
                    raise  # a leak and truncated = "drop"
                # the loop began before the answer did: no turn to write
                raise RequestError(f"{what}; no answer before the loop to keep", reason="loop",
                                   retryable=False) from None
            return kept
        stats.discarded_tokens += turn.completion_tokens
        if g.on_loop == "drop" or stats.attempts >= g.max_attempts:
            tries = "" if g.on_loop == "drop" else f" (after {stats.attempts} attempts)"
            raise RequestError(f"{what}{tries}", reason="loop", retryable=False)
        state.reseed()
        raise _Retryable("loop", what)

    async def _send(self, state: _Attempts) -> TurnResult:
        """One attempt, sent again while its server went away (not an attempt spent, not a failure)."""
        gone_since: float | None = None
        while True:
            if self._gate is not None:
                paused = time.monotonic()
                await self._gate()  # blocks while the supervisor restarts the server (or none answers)
                if gone_since is not None:  # a pause the watch bounds itself is not this request's wait
                    gone_since += time.monotonic() - paused
            try:
                detector = RepetitionDetector() if state.settings.generation.on_loop != "off" else None
                if state.settings.streamed:
                    return await self._streamed(state.body, detector, state.sample)
                return await self._whole(state.body, detector, state.sample, token_ids=state.settings.token_ids)
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

    async def _streamed(self, body: bytes, detector: RepetitionDetector | None,
                        sample: Hashable | None) -> TurnResult:
        """A streamed attempt, watched as it arrives; closed at once when the detector fires."""
        fleet = self._fleet
        url = fleet.pick(sample)
        fleet.started(url)
        started = time.monotonic()
        parser = TurnStream(detector)
        verdict = None
        scopes = self._sent.setdefault(url, set())
        with anyio.CancelScope() as scope:  # cancelled when the server is taken out (hung)
            scopes.add(scope)
            try:
                with anyio.fail_after(self.settings.generation.request_timeout_s):
                    async with self._http.open_stream(f"{url}/v1/chat/completions", body) as answer:
                        # it answers, but headers are no progress: SGLang sends them before any token,
                        # a stuck scheduler too (server/hang.py); the events below are
                        fleet.succeeded(url)
                        if not answer.is_event_stream:  # answered whole: read like an unstreamed turn
                            fleet.answered(url, time.monotonic())
                            return self._read_whole(await answer.read(), answer.content_type, detector, started,
                                                    token_ids=False)
                        async for data in answer.events():
                            fleet.answered(url, time.monotonic())  # progress: not hung (server/hang.py)
                            if data == b"[DONE]":
                                await answer.drain()  # the connection is kept for the next request
                                break
                            try:
                                chunk = orjson.loads(data)
                            except orjson.JSONDecodeError:
                                raise _Retryable("bad_response", "a stream chunk is not JSON") from None
                            verdict = parser.feed(chunk)
                            if verdict is not None:
                                break  # leaving the block closes the stream: the server aborts the request
            except BadStatus as e:
                fleet.succeeded(url)  # refused by its HTTP side: it answers, no progress of its scheduler
                classify_status(e.reply)
                raise _Retryable("bad_response", f"HTTP {e.reply.status}") from None  # not reached: 200 is no BadStatus
            except TimeoutError:
                limit = self.settings.generation.request_timeout_s
                if not parser.deltas:
                    raise _Retryable("timeout", f"no answer within the request timeout ({limit:g} s)") from None
                raise _Retryable("timeout", f"no complete answer within the request timeout ({limit:g} s; "
                                            f"{parser.completion_tokens} tokens decoded)") from None
            except HttpError as e:
                seen = f" after {parser.completion_tokens} tokens" if parser.deltas else ""
                if isinstance(e, CannotConnect | ConnectionLost):  # not NoAnswer: a slow server is still there
                    fleet.why[url] = e.why
                    self._connection_failed(url)
                    # the servers are watched: wait for one, not an attempt (as in _whole)
                    if self._gate is not None and (isinstance(e, CannotConnect) or not fleet.is_up(url)):
                        raise _ServerGone(url, f"{e.why}{seen}") from None
                raise _Retryable(e.kind, f"{e}{seen}") from None
            finally:
                fleet.finished(url)
                scopes.discard(scope)
        if scope.cancelled_caught:  # taken out meanwhile (hung): the rest of its stream will never come
            if self._gate is None:
                raise _Retryable("server_gone", f"{url} was taken out of the fleet")
            raise _ServerGone(url, "taken out of the fleet")
        aborted = verdict is not None
        if not aborted and detector is not None and parser.finish_reason is not None:
            verdict = detector.finish()  # the held-back last word
        turn = parser.result(loop=verdict, aborted=aborted)
        self._done(turn, started)
        return turn

    async def _whole(self, body: bytes, detector: RepetitionDetector | None, sample: Hashable | None, *,
                     token_ids: bool) -> TurnResult:
        """An unstreamed attempt ([output] token_ids): the detector reads the finished text."""
        fleet = self._fleet
        url = fleet.pick(sample)
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
        return self._read_whole(response.body, response.content_type, detector, started, token_ids=token_ids)

    def _read_whole(self, body: bytes, content_type: str, detector: RepetitionDetector | None, started: float, *,
                    token_ids: bool) -> TurnResult:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise _Retryable("bad_response", f"body is not JSON (content-type {content_type or '?'})") from None
        turn = parse_response(data, token_ids=token_ids)
        self._done(turn, started)
        verdict = detect_loop(turn, detector) if detector is not None else None
        return replace(turn, loop=verdict) if verdict is not None else turn

    def _done(self, turn: TurnResult, started: float) -> None:
        """The controller's completion hook: a request that ended (a loop's abort too: it held that much KV)."""
        if self._on_done is not None:
            self._on_done(turn.prompt_tokens, turn.completion_tokens, time.monotonic() - started)

    def _connection_failed(self, url: str) -> None:
        """After fail_after connection failures in a row the server is taken out of the fleet (a server
        alone too when the servers are watched, `gate`: none up pauses dispatch until its health checks
        bring it back)."""
        fleet = self._fleet
        if (len(fleet.urls) > 1 or self._gate is not None) and fleet.failed(url, time.monotonic()):
            log.warning("took %s out after %d connection errors in a row; %d of %d servers left, probing it "
                        "back with backoff", url, fleet.fail_after, len(fleet.up_urls), len(fleet.urls))


class _Attempts:
    """One turn's attempts: the body to send (its seed changes after a loop) and the accounting."""

    def __init__(self, settings: ClientSettings, body: bytes, base: dict[str, Any], stats: TurnStats,
                 sample: Hashable | None = None) -> None:
        self.settings, self.body, self.base, self.stats, self.sample = settings, body, base, stats, sample
        self._first = body

    def reseed(self) -> None:
        self.body = orjson.dumps({**self.base, "seed": loop_seed(self._first, self.stats.loops)})


def _journal_loops(stats: TurnStats, sample_id: str, dataset: str) -> None:
    """One run.log line per loop caught (the journal: not on the console; the request id is the server's)."""
    for line in stats.caught:
        JOURNAL.info("loop caught in %s: %s", sample_id, line, extra={"dataset": dataset})


def _wait(g: GenerationConfig, state: RetryCallState) -> float:
    """Before the next attempt: none after a loop (the server is fine; the next seed decides), else "full
    jitter" (AWS): uniform(0, min(max, initial × 2^(n−1))) after the n-th failed attempt, which spreads
    a burst of retries out."""
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    if isinstance(exc, _Retryable) and exc.reason == "loop":
        return 0.0
    n = state.attempt_number  # tenacity counts from the second attempt here: the first ran outside it
    return random.uniform(0, min(g.retry_max_wait_s, g.retry_initial_wait_s * 2 ** (n - 1)))


def _gave_up(e: _Retryable, attempts: int) -> RequestError:
    plural = "attempt" if attempts == 1 else "attempts"
    return RequestError(f"gave up after {attempts} {plural}: {e}", reason=e.reason, attempts=attempts)
