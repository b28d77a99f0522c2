"""What the simulated scheduler works on: its config, the per-request record, the
results it reports, and the admission/reservation arithmetic (SGLang's
python/sglang/srt/managers/schedule_policy.py and schedule_batch.py).

Pure: no clock, no I/O. `sglang_sim.engine` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sglang_sim.radix import RadixNode

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "RETRACT_DECODE_STEPS",
    "EngineConfig",
    "FinishedRequest",
    "PrefillRound",
    "SchedReq",
    "StepResult",
    "admitted_reserve",
    "clipped_reserve",
    "decode_need",
    "derive_max_running_requests",
    "finished_record",
    "ratio_after_retract",
    "running_reservation",
    "validate_request",
]

# SGLang 0.5.17 (python/sglang/srt/): managers/schedule_policy.py:69-71 reads
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, default 4096 (environ.py:399).
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20  # environ.py:398 SGLANG_RETRACT_DECODE_STEPS


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler knobs, named like SGLang's server args / environment variables."""

    max_total_num_tokens: int
    max_running_requests: int = 0  # 0 = derive_max_running_requests()
    chunked_prefill_size: int = 8192  # prefill token budget per iteration (rem_chunk_tokens)
    # server_args.py:802-813 (default 16384): PrefillAdder.rem_input_tokens; with chunked prefill on
    # it only ends a round once spent (schedule_policy.py:729-730), so the chunk budget binds first
    # whenever chunked_prefill_size <= max_prefill_tokens (the H200 log: 8192 and 16384).
    max_prefill_tokens: int = 16384
    # SGLang reserves one page per admitted request for page alignment (schedule_policy.py:1074-1084,
    # 752-760); page_size 1 on the triton / flashinfer backends.
    page_size: int = 1
    num_continuous_decode_steps: int = 1  # tokens added to every running request per decode
    hicache_tokens: int = 0  # host tier size in tokens; 0 = off
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7  # environ.py:395 SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # environ.py:396 SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # environ.py:397 SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    context_length: int = 131072
    # Largest decode batch SGLang replays a CUDA graph for (cuda_graph_config.decode.max_bs); a larger
    # batch runs eagerly, slower (profiles.NO_GRAPH_STEP_FACTOR). None: every batch has a graph.
    cuda_graph_max_bs: int | None = None


def derive_max_running_requests(max_total_num_tokens: int, context_length: int) -> int:
    """SGLang's default: clamp(pool / context_len * 512, 2048, 4096), at most pool // 2
    (mem_cache/kv_cache_configurator.py:1719-1733 resolve_max_num_reqs)."""
    by_context = min(max(max_total_num_tokens * 512 // context_length, 2048), 4096)
    return max(1, min(by_context, max_total_num_tokens // 2))


@dataclass(slots=True)
class FinishedRequest:
    rid: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prefix-cache hit at its first admission (SGLang's meta_info; not after a retraction)
    retractions: int
    finish_reason: str  # "stop" | "length" | "abort"
    queue_time_s: float  # simulated seconds from add_request to first admission
    e2e_latency_s: float  # simulated seconds from add_request to finish


@dataclass(slots=True)
class StepResult:
    dt_s: float  # simulated seconds this iteration took (0 if idle)
    new_tokens: dict[str, int]  # rid -> tokens produced this iteration
    finished: list[FinishedRequest]
    retracted: list[str]  # rids retracted this iteration (re-queued)
    prefill_tokens: int
    decode_batch: int
    cuda_graph: bool = True  # the decode ran on a CUDA graph (SGLang's can_run_cuda_graph); True for prefill


@dataclass(slots=True, eq=False)
class SchedReq:
    """One request inside the engine (SGLang's Req): its tokens, progress and KV held."""

    rid: str
    seq: tuple[int, ...]  # prompt + the exact output it will generate
    prompt_len: int
    out_len: int
    max_new: int  # what SGLang knows: the request's max_new_tokens
    reason: str  # finish reason once out_len tokens are generated
    arrival_s: float
    generated: int = 0
    node: RadixNode | None = None  # locked radix node covering seq[:locked_len]
    locked_len: int = 0
    private: int = 0  # KV tokens held only by this request (beyond locked_len)
    target: int = 0  # prefill goal: prompt_len + generated at admission
    filled: int = 0  # tokens of seq[:target] in KV so far (chunked prefill)
    admitted_s: float | None = None
    retractions: int = 0
    cached: int = 0


@dataclass(slots=True)
class PrefillRound:
    """One prefill iteration's budgets and results (PrefillAdder's state).

    `offset` is rem_total_token_offset minus the extend tokens of this round: the sim allocates a
    request's prefill tokens in the pool as it admits it (SGLang counts them in the offset and
    allocates after the round), so free() already excludes them."""

    rem_chunk: int
    rem_input: int
    offset: float
    admitted: list[SchedReq] = field(default_factory=list)
    prefill_tokens: int = 0
    prefix_tokens: int = 0
    host_tokens: int = 0


def validate_request(config: EngineConfig, prompt_len: int, out_len: int, max_new: int) -> None:
    """Raise ValueError (SGLang answers 400) if the request can never be served."""
    ctx, pool = config.context_length, config.max_total_num_tokens
    if out_len < 1 or max_new < out_len:
        raise ValueError(f"output_ids must hold 1..max_new_tokens tokens (got {out_len}, max {max_new}).")
    if prompt_len >= ctx:
        raise ValueError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({ctx} tokens)."
        )
    if prompt_len + max_new > ctx:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {prompt_len + max_new} tokens: {prompt_len} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )
    if prompt_len + out_len > pool:
        raise ValueError(
            f"The request needs {prompt_len + out_len} KV tokens ({prompt_len} prompt + {out_len} output) "
            f"but the KV cache pool holds max_total_num_tokens={pool}."
        )


def clipped_reserve(req: SchedReq, clip: int) -> int:
    """Tokens a request may still generate, clipped as PrefillAdder estimates them: what a running
    request reserves (times the ratio, schedule_policy.py:559-566) and what a candidate must fit
    (schedule_policy.py:1077-1080)."""
    return min(max(req.max_new - req.generated, 0), clip)


def admitted_reserve(req: SchedReq, clip: int) -> int:
    """What an admitted request adds to the round's offset: its whole clipped max_new_tokens, not
    the remaining part, even for a retracted request coming back (schedule_policy.py:1203-1212)."""
    return min(req.max_new, clip)


def running_reservation(running: Iterable[SchedReq], clip: int, ratio: float) -> float:
    """PrefillAdder's rem_total_token_offset for the running batch, in tokens (schedule_policy.py:490-497)."""
    return sum(clipped_reserve(r, clip) for r in running) * ratio


def decode_need(running: Iterable[SchedReq], k: int) -> int:
    """KV tokens a decode iteration of k continuous steps adds to the batch."""
    return sum(min(k, r.out_len - r.generated) for r in running)


def ratio_after_retract(running: list[SchedReq]) -> float:
    """new_token_ratio after retract_decode, over the requests left running
    (new_token_ratio_tracker.py:40-51, called from schedule_batch.py:2778-2780)."""
    gen = sum(r.generated for r in running)
    max_new = sum(r.max_new for r in running)
    return min(1.0, (gen + RETRACT_DECODE_STEPS * len(running)) / (max_new + 1))


def finished_record(req: SchedReq, reason: str, now_s: float) -> FinishedRequest:
    """The request's final report at simulated time `now_s` (s)."""
    admitted = now_s if req.admitted_s is None else req.admitted_s
    return FinishedRequest(
        rid=req.rid,
        prompt_tokens=req.prompt_len,
        completion_tokens=req.generated,
        cached_tokens=req.cached,
        retractions=req.retractions,
        finish_reason=reason,
        queue_time_s=admitted - req.arrival_s,
        e2e_latency_s=now_s - req.arrival_s,
    )
