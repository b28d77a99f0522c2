"""The chat client: one conversation in, one regenerated Sample (or a Failure) out, every assistant turn
regenerated in order. Closing a stream when the loop detector fires makes SGLang 0.5.17 abort the request and
free its KV (tokenizer_manager.py generate_request → _discard_pending_req_states sends AbortReq). With the
servers watched (a `gate`), a server that went away costs no attempt: the request is sent again until no server
took it for `server_wait_s`. A read timeout never takes a server out (it is there, only busy)."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
from anyio.lowlevel import checkpoint
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.config.server import normalise_server_url
from gen_pipeline.errors import RequestError, ServerError
from gen_pipeline.http import BadStatus, CannotConnect, ConnectionLost, Http, HttpError
from gen_pipeline.records import Failure, Message, Prompt, Sample, TurnMeta
from gen_pipeline.run import wire
from gen_pipeline.run.answer import TurnStats, cut_at_loop, judge
from gen_pipeline.run.readers import ReaderLost, Readers, ReadSpec, Seen, fetch_turn
from gen_pipeline.run.wire import ClientSettings, Retryable, TurnResult, TurnStream
from gen_pipeline.server.fleet import Fleet

log = logging.getLogger(__name__)
JOURNAL = logging.getLogger("gen_pipeline.journal.gate")  # run.log only (cli/logs.py)


class _ServerGone(Exception):
    """The server went away under a request (refused, lost, taken out): send it again; `why` says how."""

    def __init__(self, url: str, why: str):
        super().__init__(why)
        self.url, self.why = url, why


GONE_PAUSE_S = 0.5  # before sending again to a server that went away (its health checks then pause dispatch)
RequestDone = Callable[[int, int, float], None]  # (prompt_tokens, completion_tokens, latency_s)


def for_prompt(s: ClientSettings, prompt: Prompt) -> ClientSettings:
    """The settings of one sample: its variant of the sampling mix, drawn from its place in the source."""
    if s.mix is None:
        return s
    variant = s.mix.pick(prompt.id, prompt.source_index)
    return replace(s, sampling=s.mix.variants[variant].sampling, variant=variant)


def thinks(s: ClientSettings) -> bool:
    """Whether this sample's answers should carry reasoning: kept, and not turned off by its chat_template_kwargs."""
    if s.generation.reasoning != "keep":
        return False
    for kwargs in (s.sampling.chat_template_kwargs, s.sampling.extra_body.get("chat_template_kwargs")):
        if isinstance(kwargs, dict) and (kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False):
            return False
    return True


def build_sample(prompt: Prompt, dataset: str, conversation: list[Message], turns: list[TurnResult],
                 s: ClientSettings, per_turn: list[TurnMeta]) -> Sample:
    """The sample's row; meta.finish_reason: "loop" if a turn was cut at a loop, else "length" if one hit the cap."""
    reasons = {t.finish_reason for t in turns}
    finish = "loop" if "loop" in reasons else "length" if "length" in reasons else "stop"
    meta = {"model": s.model, "backend": s.backend, "finish_reason": finish,
            "prompt_tokens": sum(t.prompt_tokens for t in turns),
            "completion_tokens": sum(t.completion_tokens for t in turns), "turns": len(turns),
            "sampling": wire.sampling_dict(s.sampling), "kv_cache_dtype": s.kv_cache_dtype,
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "per_turn": per_turn,
            "chat_template_kwargs": wire.template_kwargs_text(s.sampling, s.generation.reasoning)}
    if s.mix is not None:  # only under a mix (part of the fingerprint): rows without one keep their keys
        meta["sampling_variant"] = s.variant
    return Sample(id=prompt.id, dataset=dataset, conversations=conversation, meta=meta)


# TOOL POLICY: the source's tool results answer the source's calls, so the next turns use them only while the
# regenerated calls equal the source's (`same_calls`; each result's tool_call_id then names the regenerated
# call). At the first divergence the sample ends with that turn, and meta.tool_divergence says which assistant
# turn (1-based; 0: none). A turn of tool calls with no text is a valid answer (finish_reason "tool_calls").

def _answer_due(source: tuple[Message, ...], i: int) -> bool:
    """An answer is regenerated after source message i: a user turn, or the last of a run of tool results."""
    role = source[i]["role"]
    return role == "user" or (role == "tool" and (i + 1 == len(source) or source[i + 1]["role"] != "tool"))


def _calls_key(calls: list[dict[str, Any]] | None) -> list[tuple[Any, Any]]:
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = orjson.loads(args) if isinstance(args, str) else args
        except orjson.JSONDecodeError:
            parsed = args
        out.append((fn.get("name"), parsed))
    return out


def same_calls(regenerated: list[dict[str, Any]] | None, source: list[dict[str, Any]] | None) -> bool:
    """The regenerated turn's tool calls equal the source's: the same names and arguments (as JSON values), in order."""
    return _calls_key(regenerated) == _calls_key(source)


class ChatClient:
    """Regenerates conversations against one or more servers (the fleet picks each request's server)."""

    def __init__(self, http: Http, base_urls: list[str], settings: ClientSettings, *,
                 gate: Callable[[], Awaitable[None]] | None = None, on_request_done: RequestDone | None = None,
                 fleet: Fleet | None = None, server_wait_s: float = 600.0, readers: Readers | None = None):
        self._http, self.settings, self._gate, self._on_done = http, settings, gate, on_request_done
        self._readers = readers  # while it has processes, answers are read there (readers.py)
        self._fleet = fleet if fleet is not None else Fleet([normalise_server_url(u) for u in base_urls])
        self.server_wait_s = server_wait_s
        self._sent: dict[str, set[anyio.CancelScope]] = {}  # url → its requests in flight
        self._fleet.on_taken_out.append(self._cancel_sent_to)

    def _cancel_sent_to(self, url: str) -> None:
        """The fleet took `url` out: its requests in flight end now and are sent again (_send)."""
        for scope in self._sent.get(url, ()):
            scope.cancel()

    async def regenerate(self, prompt: Prompt, dataset: str) -> Sample | Failure:
        """Every assistant turn regenerated in order; per-request failures come back as a Failure."""
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
        tools = orjson.loads(prompt.tools) if prompt.tools else None
        source = prompt.messages
        # any conversation with tool turns (without `tools`, a text answer where the source called diverges)
        tool_use = tools is not None or any(m["role"] == "tool" for m in source)
        ids: dict[str, str] = {}  # the source's tool call ids → the regenerated calls' (tool results follow them)
        diverged = 0
        for i, m in enumerate(source):
            if m["role"] == "assistant":
                continue  # source answers are replaced by the target model's
            message: Message = {"role": m["role"], "content": m["content"]}
            if m["role"] == "tool":
                message["tool_call_id"] = ids.get(m["tool_call_id"], m["tool_call_id"])
            conversation.append(message)
            history.append(message)
            if not _answer_due(source, i):
                continue
            stats = TurnStats()
            try:
                turn = await self.complete(history, s, stats, sample=(dataset, prompt.id), tools=tools)
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
            if turn.tool_calls:
                reply["tool_calls"] = turn.tool_calls
            history.append(reply)
            if s.token_ids and turn.prompt_token_ids is not None and turn.token_ids is not None:
                # the server's ids on the written turn (export/tokens.py reads them); not sent back
                reply = {**reply, "prompt_token_ids": turn.prompt_token_ids, "token_ids": turn.token_ids}
            conversation.append(reply)
            turns.append(turn)
            per_turn.append(stats.meta(turn, s.spec_per_turn))
            if turn.finish_reason == "length" and not turn.leak and s.generation.truncated == "drop":
                return Failure(prompt.id, dataset, "truncated",
                               f"turn {len(turns)} hit max_new_tokens={s.sampling.max_new_tokens}",
                               retryable=False, extra=spent.failure_extra())
            if turn.finish_reason not in ("stop", "tool_calls"):
                break  # a cut answer ends the conversation: later turns would build on it
            if tool_use:
                answered = source[i + 1] if i + 1 < len(source) and source[i + 1]["role"] == "assistant" else None
                if not same_calls(turn.tool_calls, answered.get("tool_calls") if answered else None):
                    diverged = len(turns)  # TOOL POLICY: the sample ends at its first divergence
                    break
                for old, new in zip(answered.get("tool_calls") or [] if answered else [], turn.tool_calls or [],
                                    strict=True):
                    ids[old["id"]] = new["id"] or old["id"]
        sample = build_sample(prompt, dataset, conversation, turns, s, per_turn)
        if tool_use:  # only on tool-use samples: rows without tools keep their keys
            sample.meta["tools"] = prompt.tools
            sample.meta["tool_divergence"] = diverged
        return sample

    async def complete(self, messages: list[Message], settings: ClientSettings | None = None,
                       stats: TurnStats | None = None, sample: Hashable | None = None,
                       tools: list[Any] | None = None) -> TurnResult:
        """One assistant turn, with retries and the gate's policies (`stats` filled in place); raises RequestError."""
        s = settings or self.settings
        stats = stats if stats is not None else TurnStats()
        g = s.generation
        base = wire.build_request(messages, s, tools)
        state = _Attempts(s, orjson.dumps(base), base, stats, sample)
        try:
            try:
                return await self._attempt(state)  # the common case pays nothing for the retry machinery
            except Retryable:
                if g.max_attempts == 1:
                    raise
            retrying = AsyncRetrying(stop=stop_after_attempt(g.max_attempts - 1), wait=functools.partial(_wait, g),
                                     retry=retry_if_exception_type(Retryable), reraise=True)
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(state)
        except Retryable as e:
            n = stats.attempts
            raise RequestError(f"gave up after {n} attempt{'' if n == 1 else 's'}: {e}", reason=e.reason,
                               attempts=n) from None
        except RequestError as e:
            e.attempts = stats.attempts
            raise
        raise AssertionError("unreachable")

    async def _attempt(self, state: _Attempts) -> TurnResult:
        """One request, then the gate: a loop per on_loop (retry: a new seed), an answer judged."""
        s, stats = state.settings, state.stats
        g = s.generation
        stats.attempts += 1
        turn = await self._send(state)
        if turn.loop is None:
            try:
                return judge(turn, g, thinks(s))
            except Retryable as e:  # an empty answer: its tokens were decoded for nothing
                stats.empty += e.reason == "empty_turn"
                stats.discarded_tokens += turn.completion_tokens
                if e.reason == "empty_turn":
                    state.after_empty(e)
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
            except (Retryable, RequestError) as e:
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
        raise Retryable("loop", what)

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
                return await self._exchange(state)
            except ReaderLost:
                await checkpoint()  # its listener notes the death (and starts the next reader)
                continue  # the reader process died, not the server: sent again, to another reader
            except _ServerGone as e:
                now = time.monotonic()
                gone_since = gone_since if gone_since is not None else now
                if now - gone_since >= self.server_wait_s:
                    raise Retryable("server_gone", f"no server took it for {self.server_wait_s:g} s "
                                                    f"(latest: {e.why})") from None
                if self._fleet.is_up(e.url) or not self._fleet.up_urls:
                    # no other server to send it to: pause (jittered) while the health checks catch up
                    await anyio.sleep(random.uniform(0.5, 1.0) * GONE_PAUSE_S)

    async def _exchange(self, state: _Attempts) -> TurnResult:
        """One request to the server the fleet picks, read as it arrives; every way it can fail is mapped here."""
        fleet, s = self._fleet, state.settings
        spec = ReadSpec(s.generation.on_loop != "off", s.model, s.sampling.max_new_tokens, s.token_ids)
        readers = self._readers if self._readers is not None and self._readers.active else None
        reading: TurnStream | Seen = spec.stream() if readers is None else Seen()
        url = fleet.pick(state.sample)
        fleet.started(url)
        started = time.monotonic()
        turn: TurnResult | None = None
        scopes = self._sent.setdefault(url, set())
        with anyio.CancelScope() as scope:  # cancelled when the server is taken out (hung)
            scopes.add(scope)
            try:
                with anyio.fail_after(s.generation.request_timeout_s):  # the whole answer: no read timeout
                    on_head, answered = functools.partial(fleet.succeeded, url), functools.partial(self._answered, url)
                    if readers is None:
                        assert isinstance(reading, TurnStream)
                        turn = await fetch_turn(self._http, f"{url}/v1/chat/completions", state.body, reading,
                                                token_ids=s.token_ids, on_head=on_head, answered=answered)
                    else:
                        assert isinstance(reading, Seen)
                        turn = await readers.fetch(f"{url}/v1/chat/completions", state.body, spec, reading,
                                                   on_head=on_head, answered=answered)
            except wire.OtherModel as e:  # restarted with another model: never written, never sent there again
                raise self._refuse(url, e.served) from None
            except BadStatus as e:
                fleet.succeeded(url)  # refused by its HTTP side: it answers, no progress of its scheduler
                wire.classify_status(e.reply)
                raise Retryable("bad_response", f"HTTP {e.reply.status}") from None  # a 2xx other than 200
            except TimeoutError:
                limit = s.generation.request_timeout_s
                if not reading.deltas:
                    raise Retryable("timeout", f"no answer within the request timeout ({limit:g} s)") from None
                raise Retryable("timeout", f"no complete answer within the request timeout ({limit:g} s; "
                                           f"{reading.completion_tokens} tokens decoded)") from None
            except HttpError as e:
                if isinstance(e, CannotConnect | ConnectionLost):  # not NoAnswer: a slow server is still there
                    fleet.why[url] = e.why
                    self._connection_failed(url)
                    # the servers are watched: wait for one, not an attempt; a connection cut (a flaky
                    # server or proxy cuts one answer) only once the server is out (cut again and again)
                    if self._gate is not None and (isinstance(e, CannotConnect) or not fleet.is_up(url)):
                        raise _ServerGone(url, f"{e.why}{reading.seen()}") from None
                raise Retryable(e.kind, f"{e}{reading.seen()}") from None
            finally:
                fleet.finished(url)
                scopes.discard(scope)
        if turn is None:  # taken out meanwhile (hung): the rest of its answer will never come
            if self._gate is None:
                raise Retryable("server_gone", f"{url} was taken out of the fleet")
            raise _ServerGone(url, "taken out of the fleet")
        if self._on_done is not None:  # the controller's hook (a loop's abort too: it held that much KV)
            self._on_done(turn.prompt_tokens, turn.completion_tokens, time.monotonic() - started)
        return turn

    def _answered(self, url: str) -> None:
        self._fleet.answered(url, time.monotonic())  # progress: not hung (server/hang.py)

    def _refuse(self, url: str, served: str) -> Exception:
        """`url` answered for another model: out for good; _ServerGone, or ServerError when every server is."""
        if (line := self._fleet.refuse(url, served, self.settings.model, time.monotonic())) is not None:
            log.warning("%s", line)
        refusal = self._fleet.refusal(self.settings.model)
        return ServerError(refusal) if refusal is not None else _ServerGone(url, f"it serves {served!r}")

    def _connection_failed(self, url: str) -> None:
        """After fail_after connection failures in a row the server is taken out (a lone one only when watched)."""
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
        seed = wire.loop_seed(self._first, self.stats.loops + self.stats.empty)
        self.body = orjson.dumps({**self.base, "seed": seed})

    def after_empty(self, e: Retryable) -> None:
        """After an empty answer a fixed seed is redrawn; at temperature 0 (greedy) raises RequestError instead."""
        if self.base.get("temperature") == 0:
            raise RequestError(f"{e}; not retried: at temperature 0 the model decodes greedily, a retry would "
                               "repeat it", reason="empty_turn", retryable=False)
        if "seed" in self.base:
            self.reseed()


def _journal_loops(stats: TurnStats, sample_id: str, dataset: str) -> None:
    """One run.log line per loop caught."""
    for line in stats.caught:
        JOURNAL.info("loop caught in %s: %s", sample_id, line, extra={"dataset": dataset})


def _wait(g: GenerationConfig, state: RetryCallState) -> float:
    """None after a loop (the next seed decides), else "full jitter": uniform(0, min(max, initial × 2^(n−1)))."""
    outcome = state.outcome
    exc = outcome.exception() if outcome is not None else None
    if isinstance(exc, Retryable) and exc.reason == "loop":
        return 0.0
    n = state.attempt_number  # tenacity counts from the second attempt here: the first ran outside it
    return random.uniform(0, min(g.retry_max_wait_s, g.retry_initial_wait_s * 2 ** (n - 1)))
