"""Plain records passed between the stages: Prompt in, Sample / Failure / Reject out; the server's
Capacity and LoadSnapshot; a run's RunSnapshot (what progress, the manifest and telemetry show)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import orjson

# {"role": "system"|"user"|"assistant"|"tool", "content": str, ["reasoning_content": str]}; an assistant message
# may carry "tool_calls" (OpenAI shape: [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]),
# a "tool" message "tool_call_id" (sources/loading.py reads them; run/chat.py sends and writes them)
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One validated conversation from a source; its assistant turns are only positions (each is regenerated).
    `id` is stable across runs: "<DATASET>-<source id or content hash>"."""

    id: str
    messages: tuple[Message, ...]
    source_index: int = -1
    tools: str = ""  # the conversation's `tools` (OpenAI function schemas) as JSON text; "" when it has none

    @property
    def user_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    @property
    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages if m["role"] != "assistant") + len(self.tools)


class TurnMeta(TypedDict):
    """One assistant turn's accounting, `meta.per_turn[k]` for the sample's k-th assistant turn: the same
    keys and types on every turn of every row (trainers infer one Arrow schema from the rows)."""

    finish_reason: str  # "stop" | "length" | "loop" (its text cut where a loop began: on_loop = "keep")
    prompt_tokens: int  # of the written attempt (the server's usage)
    completion_tokens: int
    reasoning_tokens: int  # SGLang's usage.reasoning_tokens; else counted where the reasoning ended
    attempts: int  # requests made for this turn (1: the first answer was written)
    loops: int  # attempts stopped by the loop detector (streamed ones aborted there)
    empty: int  # attempts with an empty or think-marker-only answer (retried)
    leak: str  # "" or the leak the written answer was repaired of (quality.LeakReason)
    tokens_not_decoded: int  # sum over aborted attempts of max_new_tokens − tokens decoded at the abort
    discarded_tokens: int  # tokens decoded by attempts that were not written (loops, empty answers)
    # the server's draft, on every turn when one runs and turns come whole (0.0 / 0: the server sent none):
    # meta_info's completion_tokens / spec_verify_ct (SGLang 0.5.17 tokenizer_manager.py), and spec_verify_ct
    spec_accept_length: NotRequired[float]
    spec_verify_ct: NotRequired[int]


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
        return orjson.dumps({"id": self.id, "dataset": self.dataset, "conversations": self.conversations,
                             "meta": self.meta}, option=orjson.OPT_APPEND_NEWLINE)


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
        return orjson.dumps({"id": self.id, "dataset": self.dataset, "reason": self.reason, "detail": self.detail,
                             "attempts": self.attempts, "retryable": self.retryable, **self.extra},
                            option=orjson.OPT_APPEND_NEWLINE)


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
        return orjson.dumps({"dataset": self.dataset, "row": self.source_index, "reason": self.reason,
                             "detail": self.detail, **where}, option=orjson.OPT_APPEND_NEWLINE)


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the server(s) can hold, summed over DP ranks and over servers."""

    max_total_num_tokens: int  # GPU KV-cache tokens (hicache adds none)
    max_running_requests: int | None  # effective decode slots limit; None = unknown
    servers: int = 1
    source: str = ""  # where it was read: "server_info", "loads", "vllm_metrics", "config", ...
    # The largest decode batch the server(s) replay a CUDA graph for (SGLang's cuda_graph_max_bs, summed
    # over DP ranks and servers): a batch above it decodes eagerly, ~2x slower a step. None = unknown.
    cuda_graph_max_bs: int | None = None


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
    # SGLang's admission estimate (/metrics sglang:new_token_ratio), the highest over servers
    new_token_ratio: float | None = None
    spec_accept_length: float | None = None  # /metrics sglang:spec_accept_length (None: 0 or absent, no draft)


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """One moment of a run (one dataset, or a job's datasets summed): what progress, the manifest, telemetry and
    `RunOptions.load_observers` show. Server figures are None when the last poll failed or is not exposed."""

    done: int  # samples in the store (committed or about to be)
    target: int
    samples_per_s: float  # over the last minute of completions
    tokens_per_s: float  # completion tokens/s, over the same minute
    in_flight: int
    window: int  # requests allowed in flight
    label: str = ""  # what it is about: the dataset, or "job B2 (2/4)"
    time_s: float = 0.0  # wall clock, time.time()
    elapsed_s: float = 0.0  # since this run (a job's dataset: since it started dispatching)
    completions: int = 0  # samples produced by this run so far
    failures: int = 0
    running: int | None = None  # the server's figures, summed over servers and DP ranks
    queued: int | None = None
    kv_used_tokens: int | None = None
    kv_usage: float | None = None  # 0..1 of kv_capacity_tokens
    kv_capacity_tokens: int | None = None
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None  # the server's CUDA-graph ceiling (Capacity.cuda_graph_max_bs)
    gen_tokens_per_s: float | None = None  # the server's own generation throughput
    retractions_total: int | None = None  # the server's cumulative counter (a restart resets it)
    retractions_run: int | None = None  # retractions during this run (restarts counted through)
    controller_mode: str | None = None  # the deciding controller's statistics(); None under a fixed window
    controller_reason: str | None = None
    fixed_window: bool = False  # the window is --window / generation.window, not the controller's
    tokens_per_request: float | None = None  # the controller's estimates (kept under a fixed window too)
    held_tokens_per_request: float | None = None
    kv_dtype: str | None = None  # the server's, as /server_info says
    mem_fraction_static: float | None = None
    restarts: int = 0
    peak_running: int | None = None  # the highest figures of the run's load polls
    peak_queued: int | None = None
    peak_kv_usage: float | None = None
    final: bool = False  # the run has ended: nothing in flight, the last poll's load is stale
    server_wait_s: float | None = None  # attached, no server answers: dispatch paused this long ...
    server_wait_limit_s: float | None = None  # ... of at most this long (--server-wait-s)
    client_cpu: float | None = None  # cores the CLI process used over the last ~10 s (run/stats.py CpuMeter)
    front_end_cpu: float | None = None  # ... a launched SGLang's HTTP front end (run/stats.py FrontEndMeter)
    spec_accept_length: float | None = None  # the server-wide draft acceptance, as the last poll read it
    readers: int = 0  # reader processes reading the answers now (run/readers.py)

    @property
    def eta_s(self) -> float | None:
        left = self.target - self.done
        return left / self.samples_per_s if self.samples_per_s > 0 and left > 0 else None
