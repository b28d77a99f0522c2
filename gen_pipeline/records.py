"""Plain records passed between the stages: Prompt in, Sample / Failure / Reject out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str, ["reasoning_content": str]}


@dataclass(frozen=True, slots=True)
class Prompt:
    """One validated conversation from a source.

    `messages` keeps the source's assistant turns only as positions: the pipeline sends each
    user turn (with the regenerated history) and replaces every assistant turn.
    `id` is stable across runs: "<DATASET>-<source id or content hash>".
    """

    id: str
    messages: tuple[Message, ...]
    source_index: int = -1

    @property
    def user_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    @property
    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages if m["role"] != "assistant")


@dataclass(slots=True)
class Sample:
    """One finished training sample, the unit the store writes (one JSON line)."""

    id: str
    dataset: str
    conversations: list[Message]
    meta: dict[str, Any]

    @property
    def truncated(self) -> bool:
        return self.meta.get("finish_reason") == "length"

    def to_json(self) -> bytes:
        """One JSON line, newline included."""
        return orjson.dumps(
            {"id": self.id, "dataset": self.dataset, "conversations": self.conversations, "meta": self.meta},
            option=orjson.OPT_APPEND_NEWLINE,
        )


@dataclass(slots=True)
class Failure:
    """A prompt that could not be turned into a sample in this run (retried by the next run)."""

    id: str
    dataset: str
    reason: str  # short machine key: "http_400", "timeout", "retries_exhausted", "truncated_dropped", ...
    detail: str  # the server's message or the exception text
    attempts: int = 1
    retryable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"id": self.id, "dataset": self.dataset, "reason": self.reason, "detail": self.detail,
             "attempts": self.attempts, "retryable": self.retryable, **self.extra},
            option=orjson.OPT_APPEND_NEWLINE,
        )


@dataclass(frozen=True, slots=True)
class Reject:
    """An input row that failed validation; counted and written to the rejects file, never sent."""

    dataset: str
    source_index: int
    reason: str  # "empty_content", "roles_not_alternating", "bad_type", "missing_field", ...
    detail: str = ""
    file: str = ""  # for a line that is not JSON (reason bad_json): the file and its 1-based line
    line: int = 0

    def to_json(self) -> bytes:
        where = {"file": self.file, "line": self.line} if self.file else {}
        return orjson.dumps(
            {"dataset": self.dataset, "row": self.source_index, "reason": self.reason, "detail": self.detail,
             **where},
            option=orjson.OPT_APPEND_NEWLINE,
        )


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the server(s) can hold, summed over DP ranks and over servers."""

    max_total_num_tokens: int  # GPU KV-cache tokens (hicache adds none)
    max_running_requests: int | None  # effective decode slots limit; None = unknown
    servers: int = 1
    source: str = ""  # where it was read: "server_info", "loads", "vllm_metrics", "config", ...


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """One poll of the server's live load (summed over DP ranks and servers). None = not exposed."""

    t_s: float  # monotonic seconds when polled (the caller's clock)
    running: int
    queued: int
    used_tokens: int | None = None
    token_usage: float | None = None  # 0..1 of max_total_num_tokens
    retractions_total: int | None = None  # cumulative counter (sglang) / preemptions (vllm)
    gen_tokens_total: int | None = None  # cumulative generated tokens
    gen_throughput: float | None = None  # tok/s as the server reports it
    # SGLang's admission estimate (/metrics sglang:new_token_ratio: the last prefill round's); the
    # highest over servers
    new_token_ratio: float | None = None
