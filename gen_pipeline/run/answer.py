"""One assistant turn's answer, read and judged: pure functions and records, no I/O (run/chat.py does the
requests). What each attempt came back with (TurnResult), read from a chat stream chunk by chunk
(TurnStream, with the loop detector fed as the text arrives) or from a whole completion
(parse_response); what the quality gate makes of it (`judge`: empty, marker-only and leaked answers;
`cut_at_loop`: on_loop = "keep"); and the turn's accounting (TurnStats → records.TurnMeta, meta.per_turn).

What SGLang 0.5.17 streams (python/sglang/srt/entrypoints/openai/serving_chat.py, _generate_chat_stream):
a first chunk with the role and empty content, then per step a reasoning chunk and a content chunk
(the reasoning parser splits the text; all reasoning comes before the answer), a chunk with the
finish_reason, the usage chunk (choices empty) when stream_options.include_usage, then `[DONE]`; with
stream_options.continuous_usage_stats every content chunk carries the usage so far. A graceful abort
ends with finish_reason "abort"; an abort with a status code writes an error object
(`{"object": "error", "message", "code"}`) as a data line and stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.errors import RequestError
from gen_pipeline.quality import LeakReason, LoopVerdict, RepetitionDetector, check_turn, strip_markers, tail_loop
from gen_pipeline.records import TurnMeta

# The think markers a reasoning parser strips, in pairs (gen_pipeline/quality/leaks.py lists them all):
# content that still holds one pair splits into (reasoning, answer); other markers are removed.
THINK_PAIRS = (("<think>", "</think>"), ("◁think▷", "◁/think▷"), ("<mm:think>", "</mm:think>"),
               ("[THINK]", "[/THINK]"), ("<|open|>think", "<|close|>think"))


class Retryable(Exception):
    """An attempt failed in a way the next attempt may not: reason + detail for the Failure."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What one attempt came back with (after `judge`: what is written)."""

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


@dataclass(slots=True)
class TurnStats:
    """One turn's accounting over its attempts (meta.per_turn; records.TurnMeta says each key)."""

    attempts: int = 0
    loops: int = 0
    empty: int = 0
    tokens_not_decoded: int = 0
    discarded_tokens: int = 0
    caught: list[str] = field(default_factory=list)  # one line per loop caught (run.log)

    def meta(self, turn: TurnResult) -> TurnMeta:
        return {"finish_reason": turn.finish_reason, "prompt_tokens": turn.prompt_tokens,
                "completion_tokens": turn.completion_tokens, "reasoning_tokens": turn.reasoning_tokens,
                "attempts": self.attempts, "loops": self.loops, "empty": self.empty, "leak": turn.leak,
                "tokens_not_decoded": self.tokens_not_decoded, "discarded_tokens": self.discarded_tokens}

    def add(self, other: TurnStats) -> None:
        self.attempts += other.attempts
        self.loops += other.loops
        self.empty += other.empty
        self.tokens_not_decoded += other.tokens_not_decoded
        self.discarded_tokens += other.discarded_tokens
        self.caught += other.caught

    def failure_extra(self) -> dict[str, int]:
        """What a Failure records of its sample's turns (errors.jsonl): status counts loops and savings from it."""
        return {"loops": self.loops, "empty": self.empty, "tokens_not_decoded": self.tokens_not_decoded,
                "discarded_tokens": self.discarded_tokens}


# ---------------------------------------------------------------- reading an answer

def _error_of(chunk: dict[str, Any]) -> None:
    """A data line that is SGLang's error object: 4xx (not 408/429) is final, the rest retryable."""
    err = chunk.get("error", chunk)
    message = str(err.get("message") if isinstance(err, dict) else err)
    code = err.get("code") if isinstance(err, dict) else None
    code = code if isinstance(code, int) and not isinstance(code, bool) else 500
    if 400 <= code < 500 and code not in (408, 429):
        raise RequestError(f"HTTP {code}: {message}", reason=f"http_{code}", retryable=False)
    raise Retryable(f"http_{code}", f"the server ended the stream with an error: {message}")


class TurnStream:
    """A chat completion stream's chunks (parsed JSON), fed in arrival order: the text, the token counts,
    the finish reason. `detector` (None: on_loop = "off") is fed each reasoning and content delta as it
    comes; `feed` returns its verdict when it fires. Raises Retryable / RequestError for an error chunk."""

    __slots__ = ("_reasoning", "_content", "detector", "finish_reason", "usage", "deltas",
                 "reasoning_deltas", "tokens_at_last_reasoning", "rid")

    def __init__(self, detector: RepetitionDetector | None) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self.detector = detector
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None  # the latest usage seen (continuous or final)
        self.deltas = 0  # text deltas seen (one per token or per stream_interval tokens)
        self.reasoning_deltas = 0
        self.tokens_at_last_reasoning: int | None = None  # completion tokens when the last reasoning came
        self.rid = ""  # the chunks' `id`: SGLang's request id (its log's rid)

    def feed(self, chunk: Any) -> LoopVerdict | None:
        if not isinstance(chunk, dict):
            raise Retryable("bad_response", "a stream chunk is not a JSON object")
        if not self.rid:
            self.rid = str(chunk.get("id") or "")
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if choices is None and (chunk.get("object") == "error" or "error" in chunk):
                _error_of(chunk)
            return None
        try:
            choice = choices[0]
            delta = choice.get("delta") or {}
            reasoning, content = delta.get("reasoning_content"), delta.get("content")
            finish = choice.get("finish_reason")
        except (AttributeError, IndexError, KeyError, TypeError):
            raise Retryable("bad_response", "a stream chunk has no choices[0].delta") from None
        verdict = None
        det = self.detector
        if reasoning:
            self._reasoning.append(reasoning)
            self.deltas += 1
            self.reasoning_deltas += 1
            if usage is not None:
                self.tokens_at_last_reasoning = usage.get("completion_tokens")
            if det is not None:
                verdict = det.feed(reasoning)
        if content and verdict is None:
            self._content.append(content)
            self.deltas += 1
            if det is not None:
                verdict = det.feed(content)
        if finish:
            self.finish_reason = finish
        return verdict

    @property
    def completion_tokens(self) -> int:
        """Tokens decoded so far: the usage's count when the server sends it, else the deltas counted."""
        n = self.usage.get("completion_tokens") if self.usage else None
        return n if isinstance(n, int) and not isinstance(n, bool) else self.deltas

    def result(self, *, loop: LoopVerdict | None = None, aborted: bool = False) -> TurnResult:
        """The attempt's answer (`aborted`: the stream was closed on `loop`). A stream that ended without a
        finish reason was cut (unless it was closed); "abort" is the server's; no usage is a bad answer
        (the controller needs the counts)."""
        reasoning, content = "".join(self._reasoning), "".join(self._content)
        if not aborted:
            if self.finish_reason is None:
                raise Retryable("connection", f"the stream ended before the answer did ({self.completion_tokens} "
                                              "tokens decoded)")
            if self.finish_reason == "abort":
                raise Retryable("aborted", f"the server aborted the request after {self.completion_tokens} tokens")
            if self.usage is None:
                raise Retryable("bad_response", "the stream carried no usage (token counts)")
        usage = self.usage or {}
        prompt_tokens = _int(usage.get("prompt_tokens"))
        completion = self.completion_tokens
        reasoning_tokens = _int(usage.get("reasoning_tokens"), -1)
        if reasoning_tokens < 0:  # not SGLang: counted where the reasoning ended
            reasoning_tokens = (self.tokens_at_last_reasoning if self.tokens_at_last_reasoning is not None
                                else self.reasoning_deltas)
        finish = "length" if aborted else _finish(self.finish_reason)
        if loop is None and finish == "length" and self.detector is not None:  # at the cap: the tail once more
            loop = tail_loop(reasoning + content, self.detector.thresholds)
        return TurnResult(content, reasoning, finish, prompt_tokens, completion, min(reasoning_tokens, completion),
                          loop=loop, aborted=aborted, rid=self.rid)


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _finish(finish: Any) -> str:
    if finish in ("stop", "length"):
        return str(finish)
    return "length" if finish == "max_tokens" else "stop"


def parse_response(data: Any, *, token_ids: bool = False) -> TurnResult:
    """The fields we keep from a whole chat completion (token_ids: the server's prompt_token_ids and
    token_ids too, SGLang's return_token_ids); raises Retryable when it is malformed."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or ""
        finish = choice.get("finish_reason")
        usage = data.get("usage")
        if not isinstance(usage, dict):
            raise Retryable("bad_response", "the response has no usage (token counts)")
        prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        ids: tuple[list[int] | None, list[int] | None] = (None, None)
        if token_ids:
            ids = choice.get("prompt_token_ids"), choice.get("token_ids")
            if not all(isinstance(x, list) for x in ids):
                raise Retryable("bad_response", "the response has no prompt_token_ids / token_ids (return_token_ids "
                                                "needs SGLang 0.5.13 or later)")
    except Retryable:
        raise
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
                      rid=str(data.get("id") or ""))


def detect_loop(turn: TurnResult, detector: RepetitionDetector) -> LoopVerdict | None:
    """The detector over a finished answer (not streamed): reasoning, then content, as they would arrive."""
    if turn.reasoning:
        detector.feed(turn.reasoning)
    if turn.content:
        detector.feed(turn.content)
    verdict = detector.finish()
    if verdict is None and turn.finish_reason == "length":  # at the cap: the tail once more
        verdict = tail_loop(turn.reasoning + turn.content, detector.thresholds)
    return verdict


# ---------------------------------------------------------------- the quality gate's policies

def split_think(content: str) -> tuple[str, str]:
    """("reasoning", "answer") from content that still carries think markers (no reasoning parser, or one
    that missed them): the text inside the first marker pair is the reasoning; stray markers are removed."""
    for open_, close in THINK_PAIRS:
        if close in content:
            head, _, tail = content.partition(close)
            return strip_markers(head.replace(open_, "")).strip(), strip_markers(tail).lstrip()
    return "", strip_markers(content)


def cut_at_loop(turn: TurnResult, verdict: LoopVerdict) -> TurnResult:
    """on_loop = "keep": the text before the loop's first copy (verdict.loop_start_char counts the
    reasoning then the content, as they arrived), finish_reason "loop"."""
    at = verdict.loop_start_char
    if at <= len(turn.reasoning):
        reasoning, content = turn.reasoning[:at], ""
    else:
        reasoning, content = turn.reasoning, turn.content[:at - len(turn.reasoning)]
    return replace(turn, reasoning=reasoning.rstrip(), content=content.rstrip(), finish_reason="loop")


def empty_detail(turn: TurnResult, what: str = "empty") -> str:
    return (f"the assistant turn is {what} ({turn.completion_tokens} completion tokens, "
            f"finish_reason {turn.finish_reason})")


def reject_empty(turn: TurnResult, policy: str, what: str = "empty") -> None:
    """An empty (or marker-only) assistant turn is never written (validate rejects it): "retry" makes it
    a retryable attempt (RequestError once max_attempts are spent), "fail" a failure at once."""
    detail = empty_detail(turn, what)
    if policy == "fail":
        raise RequestError(detail, reason="empty_turn", retryable=False)
    raise Retryable("empty_turn", detail)


def judge(turn: TurnResult, g: GenerationConfig, reasoning_expected: bool | None = None) -> TurnResult:
    """The answer to write, by the gate's checks of a finished turn (quality/leaks.py `check_turn` on the
    server's text): empty and marker-only answers follow `empty_turn` (raise Retryable or RequestError);
    a leak follows `truncated`: "drop" is a final failure (reason "truncated" for a turn cut by
    max_new_tokens, else "leak"), "keep" writes it repaired and flagged (`leak`):
      think_marker          markers removed; the text inside a marker pair becomes the reasoning
      reasoning_in_content  the text (the cut thinking) moved to reasoning, the answer empty
      cut_in_reasoning      (no answer)
    A kept turn with no answer left is never written (validate rejects a turn with empty content): a final
    failure, reason "truncated", when the thinking ran to max_new_tokens (a retry would run to the same
    cap), else an empty answer (`empty_turn`)."""
    expected = g.reasoning == "keep" if reasoning_expected is None else reasoning_expected
    finding = check_turn(turn.content, turn.reasoning, turn.finish_reason, reasoning_expected=expected)
    if finding is None:
        return turn
    reason = finding.reason
    if reason in (LeakReason.EMPTY, LeakReason.MARKER_ONLY):
        reject_empty(turn, g.empty_turn, "empty" if reason is LeakReason.EMPTY else "think markers only")
    if g.truncated == "drop":
        cut = turn.finish_reason == "length"
        raise RequestError(f"{reason.value}: {finding.detail}", reason="truncated" if cut else "leak", retryable=False)
    if reason is LeakReason.THINK_MARKER:
        extra, content = split_think(turn.content)
        if not content.strip() and turn.reasoning.strip():  # the parser found the thinking: a stray marker
            extra, content = "", strip_markers(turn.content).strip()
        reasoning = f"{turn.reasoning}\n{extra}".strip() if turn.reasoning else extra
        kept = replace(turn, content=content, reasoning=reasoning)
    elif reason is LeakReason.REASONING_IN_CONTENT:
        kept = replace(turn, reasoning=turn.content, content="")
    else:
        kept = turn
    if not kept.content.strip():  # no answer left (validate rejects an empty turn)
        if turn.finish_reason == "length":  # the thinking ran to the cap: the same request would again
            raise RequestError(f"{reason.value}: the thinking was cut by max_new_tokens "
                               f"({turn.completion_tokens} tokens) before any answer", reason="truncated",
                               retryable=False)
        reject_empty(turn, g.empty_turn)
    return replace(kept, leak=reason.value)

