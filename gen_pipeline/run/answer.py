"""One assistant turn's answer, judged by the quality gate (no I/O), and the turn's accounting (TurnStats)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gen_pipeline.config.dataset import GenerationConfig
from gen_pipeline.errors import RequestError
from gen_pipeline.quality import LeakReason, LoopVerdict, RepetitionDetector, check_turn, strip_markers, tail_loop
from gen_pipeline.records import TurnMeta
from gen_pipeline.run.wire import Retryable, TurnResult

# The think markers a reasoning parser strips, in pairs (gen_pipeline/quality/leaks.py lists them all).
THINK_PAIRS = (("<think>", "</think>"), ("◁think▷", "◁/think▷"), ("<mm:think>", "</mm:think>"),
               ("[THINK]", "[/THINK]"), ("<|open|>think", "<|close|>think"))


@dataclass(slots=True)
class TurnStats:
    """One turn's accounting over its attempts (meta.per_turn; records.TurnMeta says each key)."""

    attempts: int = 0
    loops: int = 0
    empty: int = 0
    tokens_not_decoded: int = 0
    discarded_tokens: int = 0
    caught: list[str] = field(default_factory=list)  # one line per loop caught (run.log)

    def meta(self, turn: TurnResult, spec: bool = False) -> TurnMeta:
        """`spec`: the draft's acceptance is recorded on every turn (ClientSettings.spec_per_turn)."""
        meta: TurnMeta = {"finish_reason": turn.finish_reason, "prompt_tokens": turn.prompt_tokens,
                          "completion_tokens": turn.completion_tokens, "reasoning_tokens": turn.reasoning_tokens,
                          "attempts": self.attempts, "loops": self.loops, "empty": self.empty, "leak": turn.leak,
                          "tokens_not_decoded": self.tokens_not_decoded, "discarded_tokens": self.discarded_tokens}
        if spec:
            meta["spec_accept_length"], meta["spec_verify_ct"] = turn.spec
        return meta

    def add(self, other: TurnStats) -> None:
        for name in ("attempts", "loops", "empty", "tokens_not_decoded", "discarded_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.caught += other.caught

    def failure_extra(self) -> dict[str, int]:
        """What a Failure records of its sample's turns (errors.jsonl)."""
        return {k: getattr(self, k) for k in ("loops", "empty", "tokens_not_decoded", "discarded_tokens")}


def detect_loop(turn: TurnResult, detector: RepetitionDetector) -> LoopVerdict | None:
    """The detector over a whole answer: reasoning, then content, as they would arrive."""
    if turn.reasoning:
        detector.feed(turn.reasoning)
    if turn.content:
        detector.feed(turn.content)
    verdict = detector.finish()
    if verdict is None and turn.finish_reason == "length":  # at the cap: the tail once more
        verdict = tail_loop(turn.reasoning + turn.content, detector.thresholds)
    return verdict


def split_think(content: str) -> tuple[str, str]:
    """(reasoning, answer) from content that still carries think markers; stray markers are removed."""
    for open_, close in THINK_PAIRS:
        if close in content:
            head, _, tail = content.partition(close)
            return strip_markers(head.replace(open_, "")).strip(), strip_markers(tail).lstrip()
    return "", strip_markers(content)


def cut_at_loop(turn: TurnResult, verdict: LoopVerdict) -> TurnResult:
    """on_loop = "keep": the text before the loop's first copy (loop_start_char counts reasoning then content)."""
    at = verdict.loop_start_char
    if at <= len(turn.reasoning):
        reasoning, content = turn.reasoning[:at], ""
    else:
        reasoning, content = turn.reasoning, turn.content[:at - len(turn.reasoning)]
    return replace(turn, reasoning=reasoning.rstrip(), content=content.rstrip(), finish_reason="loop")


def reject_empty(turn: TurnResult, policy: str, what: str = "empty") -> None:
    """An empty (or marker-only) turn is never written: "retry" raises Retryable, "fail" RequestError."""
    detail = (f"the assistant turn is {what} ({turn.completion_tokens} completion tokens, "
              f"finish_reason {turn.finish_reason})")
    if policy == "fail":
        raise RequestError(detail, reason="empty_turn", retryable=False)
    raise Retryable("empty_turn", detail)


def judge(turn: TurnResult, g: GenerationConfig, reasoning_expected: bool | None = None) -> TurnResult:
    """The answer to write, by quality/leaks.py `check_turn`: empty answers follow `empty_turn`, a leak follows
    `truncated` ("drop": a final failure, "keep": written repaired and flagged); raises Retryable or RequestError."""
    if turn.tool_calls and not turn.content.strip():
        return turn  # a tool call is the answer (content empty, as SGLang's tool parser leaves it): not empty
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
