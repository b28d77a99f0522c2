"""Discrete-time model of SGLang's scheduler: KV pool, admission, decode, retraction.

Pure and synchronous: no clock, no I/O. The HTTP front calls `step()` in a loop
and turns each `StepResult` into streamed tokens and finished responses.

What it mirrors (SGLang, python/sglang/srt/managers/):
- One scheduler iteration is either a prefill batch or a decode batch; prefill
  wins whenever something can be admitted (scheduler.get_next_batch_to_run).
- Admission is FCFS (default `--schedule-policy fcfs` keeps queue order) with
  PrefillAdder's check (schedule_policy.py): a candidate needs
  `uncached prompt + min(max_new - generated, CLIP) < free + evictable - offset`,
  where `offset = sum over running of min(max_new - generated, CLIP) * new_token_ratio`
  plus what earlier candidates of the same round reserved. The candidate itself
  reserves its full clipped max_new (no ratio), exactly as add_one_req does.
  A NO_TOKEN result (or max_running_requests reached) sets `batch_is_full`,
  which stops admission until a request finishes, retracts or aborts.
- A prompt longer than the round's chunk budget is prefilled in chunks over
  consecutive iterations (one chunked request at a time); decode waits meanwhile.
- Decode: each running request gains `num_continuous_decode_steps` tokens. When
  the pool (after evicting unreferenced cache) cannot hold them, retract_decode
  (schedule_batch.py) runs: sort by (len(output), -len(prompt)) descending, pop
  from the end (fewest generated tokens first), at least one, until the rest fit;
  the last survivor is aborted if even it cannot fit. Retracted requests keep
  their generated tokens, free their KV without inserting it into the cache
  (`release_kv_cache(..., is_insert=False)`) and are appended to the END of the
  waiting queue (scheduler._extend_requests_to_queue uses `waiting_queue.extend`).
  On re-admission prompt + generated is prefilled again minus any cached prefix.
- new_token_ratio: init = min(0.7 * conservativeness, 1), floor = init * 0.14,
  linear decay of (init - floor) / 600 per decode iteration without retraction;
  after a retraction it becomes min(1, (sum generated + 20 * n) / (sum max_new + 1))
  over the requests left running (environ SGLANG_RETRACT_DECODE_STEPS = 20).
- After a prefill the request's sequence is inserted into the radix cache and
  locked (cache_unfinished_req); on finish prompt + output is inserted
  (cache_finished_req) and unlocked, so a follow-up turn finds it cached.

Simplifications (documented, observable only in latency): the first output
token comes from the first decode iteration rather than the prefill pass; a
decode iteration of k continuous steps is charged as k forward passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from gen_pipeline.sim.profiles import HardwareProfile
from gen_pipeline.sim.radix import RadixCache, RadixNode

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "Engine",
    "EngineConfig",
    "FinishedRequest",
    "StepResult",
    "derive_max_running_requests",
]

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20  # environ.py, SGLANG_RETRACT_DECODE_STEPS
DECODE_LOG_INTERVAL = 40  # server_args.decode_log_interval: gen_throughput is per window


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler knobs, named like SGLang's server args / environment variables."""

    max_total_num_tokens: int
    max_running_requests: int = 0  # 0 = derive_max_running_requests()
    chunked_prefill_size: int = 8192  # prefill token budget per iteration
    num_continuous_decode_steps: int = 1  # tokens added to every running request per decode
    hicache_tokens: int = 0  # host tier size in tokens; 0 = off
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    context_length: int = 131072


def derive_max_running_requests(max_total_num_tokens: int, context_length: int) -> int:
    """SGLang's default: clamp(pool / context_len * 512, 2048, 4096), at most pool // 2
    (mem_cache/kv_cache_configurator.py; older model_runner.py used the same clamp)."""
    by_context = min(max(max_total_num_tokens * 512 // context_length, 2048), 4096)
    return max(1, min(by_context, max_total_num_tokens // 2))


@dataclass(slots=True)
class FinishedRequest:
    rid: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prefix-cache hits summed over every admission (as SGLang's meta_info)
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


@dataclass(slots=True, eq=False)
class _Req:
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
class _Round:
    """One prefill iteration's budgets and results (PrefillAdder's state)."""

    rem_chunk: int
    offset: float
    admitted: list[_Req] = field(default_factory=list)
    prefill_tokens: int = 0
    prefix_tokens: int = 0
    host_tokens: int = 0


class Engine:
    """SGLang-like scheduler over simulated time; see the module docstring."""

    def __init__(self, config: EngineConfig, profile: HardwareProfile) -> None:
        self.config = config
        self.profile = profile
        self.max_running_requests = config.max_running_requests or derive_max_running_requests(
            config.max_total_num_tokens, config.context_length
        )
        self._init_ratio = min(config.init_new_token_ratio * config.schedule_conservativeness, 1.0)
        self._min_ratio = min(self._init_ratio * config.min_new_token_ratio_factor, 1.0)
        self._ratio_decay = (self._init_ratio - self._min_ratio) / config.new_token_ratio_decay_steps
        self.new_token_ratio = self._init_ratio
        self._radix = RadixCache(config.hicache_tokens)
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._chunked: _Req | None = None
        self._by_rid: dict[str, _Req] = {}
        self._private = 0  # sum of _Req.private over running and chunked requests
        self._now_s = 0.0
        self._batch_is_full = False
        self._pending: list[FinishedRequest] = []
        self._window = [0, 0.0, 0]  # gen tokens, seconds, decode iterations since last log
        self.last_gen_throughput = 0.0
        self._c = dict.fromkeys(_COUNTERS, 0)

    # ---- public API -----------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self._now_s

    @property
    def idle(self) -> bool:
        return not (self._waiting or self._running or self._chunked)

    @property
    def num_running(self) -> int:
        """Requests holding KV: the decode batch plus an in-flight chunked prefill."""
        return len(self._running) + (self._chunked is not None)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_rids(self) -> list[str]:
        """The waiting queue in admission order (retracted requests re-enter at the end)."""
        return [r.rid for r in self._waiting]

    @property
    def cache_tokens(self) -> dict[str, int]:
        """Prefix-cache sizes in tokens: on GPU, of which evictable, and host-only."""
        radix = self._radix
        return {"device": radix.device_size, "evictable": radix.evictable_size, "host": radix.host_size}

    @property
    def used_tokens(self) -> int:
        """KV tokens in the pool: running requests plus the whole prefix cache."""
        return self._radix.device_size + self._private

    def advance_idle(self, dt_s: float) -> None:
        """Let simulated time pass while nothing runs (the front's wall clock)."""
        self._now_s += dt_s

    def add_request(
        self,
        rid: str,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        finish_reason: str = "stop",
        *,
        max_new_tokens: int | None = None,
    ) -> None:
        """Queue a request that will generate exactly `output_ids`.

        Raises ValueError (SGLang answers 400) if it can never fit or rid is in use."""
        max_new = len(output_ids) if max_new_tokens is None else max_new_tokens
        self._validate(rid, len(prompt_ids), len(output_ids), max_new)
        req = _Req(
            rid=rid,
            seq=tuple(prompt_ids) + tuple(output_ids),
            prompt_len=len(prompt_ids),
            out_len=len(output_ids),
            max_new=max_new,
            reason=finish_reason,
            arrival_s=self._now_s,
        )
        self._by_rid[rid] = req
        self._waiting.append(req)
        self._c["num_requests_total"] += 1

    def abort(self, rid: str) -> bool:
        """Drop a waiting or running request and free its KV; it is reported with
        finish_reason "abort" in the next step's `finished`. False if unknown."""
        req = self._by_rid.get(rid)
        if req is None:
            return False
        if req is self._chunked:
            self._chunked = None
        elif req in self._running:
            self._running.remove(req)
            self._batch_is_full = False
        else:
            self._waiting.remove(req)
        self._release(req)
        self._pending.append(self._record(req, "abort"))
        return True

    def step(self) -> StepResult:
        """Run one scheduler iteration: a prefill batch if anything can be admitted,
        else a decode batch of every running request; idle steps take 0 s."""
        finished, self._pending = self._pending, []
        if self._chunked is not None or (self._waiting and not self._batch_is_full):
            result = self._prefill_iteration(finished)
            if result is not None:
                return result
        if self._running:
            return self._decode_iteration(finished)
        return StepResult(0.0, {}, finished, [], 0, 0)

    def flush_cache(self) -> bool:
        """Empty the prefix cache (SGLang `/flush_cache`); refused (False) unless idle."""
        if not self.idle:
            return False
        self._radix.reset()
        self.new_token_ratio = self._init_ratio
        return True

    def loads(self) -> dict:
        """One dp rank's entry of SGLang's `/v1/loads` (managers/load_snapshot.py keys)."""
        pool = self.config.max_total_num_tokens
        num_used = self.used_tokens - self._radix.evictable_size
        waiting_tokens = sum(r.prompt_len + r.generated for r in self._waiting)
        hit, computed = self._c["cached_prefill_tokens_total"], self._c["computed_prefill_tokens_total"]
        return {
            "dp_rank": 0,
            "num_running_reqs": self.num_running,
            "num_waiting_reqs": self.num_waiting,
            "num_waiting_uncached_tokens": waiting_tokens,  # upper bound: cache not consulted
            "num_used_tokens": num_used,
            "num_total_tokens": num_used + waiting_tokens,
            "max_total_num_tokens": pool,
            "max_running_requests": self.max_running_requests,
            "token_usage": round(num_used / pool, 4),
            "gen_throughput": round(self.last_gen_throughput, 2),
            "cache_hit_rate": round(hit / (hit + computed), 4) if hit + computed else 0.0,
            "utilization": round(num_used / pool, 4),
            "queues": {
                "waiting": len(self._waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": sum(1 for r in self._waiting if r.retractions),
            },
        }

    def counters(self) -> dict:
        """Cumulative counters; prompt/generation/cached totals count finished requests
        (as SGLang's tokenizer-side metrics do), the rest count as events happen."""
        return dict(self._c)

    # ---- validation -----------------------------------------------------------

    def _validate(self, rid: str, prompt_len: int, out_len: int, max_new: int) -> None:
        ctx, pool = self.config.context_length, self.config.max_total_num_tokens
        if rid in self._by_rid:
            raise ValueError(f"Duplicate request rid {rid!r}: a request with this id is still running.")
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

    # ---- prefill --------------------------------------------------------------

    def _prefill_iteration(self, finished: list[FinishedRequest]) -> StepResult | None:
        rnd = _Round(rem_chunk=self.config.chunked_prefill_size, offset=0.0)
        if self._chunked is not None:
            self._continue_chunk(self._chunked, rnd)
        if self._chunked is None and self._waiting and not self._batch_is_full:
            rnd.offset = self._running_reservation()
            self._admit_waiting(rnd)
        if not rnd.admitted:
            return None
        for req in rnd.admitted:
            if req.filled == req.target:
                self._complete_prefill(req)
            else:
                self._chunked = req
        dt = self.profile.step_time_s(len(rnd.admitted), rnd.prefix_tokens, rnd.prefill_tokens)
        dt += rnd.host_tokens * self.profile.hicache_load_per_token_s
        self._advance(dt)
        self._c["prefill_steps_total"] += 1
        return StepResult(dt, {}, finished, [], rnd.prefill_tokens, 0)

    def _running_reservation(self) -> float:
        clip, ratio = self.config.clip_max_new_tokens, self.new_token_ratio
        return sum(min(r.max_new - r.generated, clip) for r in self._running) * ratio

    def _admit_waiting(self, rnd: _Round) -> None:
        """PrefillAdder loop: FCFS until a candidate does not fit or budgets run out."""
        while self._waiting and rnd.rem_chunk > 0:
            if len(self._running) + len(rnd.admitted) >= self.max_running_requests:
                self._batch_is_full = True
                return
            req = self._waiting[0]
            alone = not self._running and not rnd.admitted
            if not self._try_admit(req, rnd, force=alone):
                self._batch_is_full = True
                return
            self._waiting.popleft()
            if req.filled < req.target:  # it became the round's chunked request
                return

    def _try_admit(self, req: _Req, rnd: _Round, force: bool) -> bool:
        """Admit `req` if its tokens + clipped max_new fit the remaining budget.

        `force` admits a request alone on an empty engine even past the reservation
        (SGLang would wait forever; the pool physically holds it, see _validate)."""
        seq_now = req.seq[: req.prompt_len + req.generated]
        # At least one token is always computed (SGLang caps the prefix at len - 1).
        match = self._radix.match_prefix(seq_now[:-1], self._now_s)
        self._radix.lock(match.host_node)  # pin before measuring evictable (SGLang _lock_node)
        prefix = match.device_len + match.host_len
        extend = len(seq_now) - prefix
        reserve = min(req.max_new - req.generated, self.config.clip_max_new_tokens)
        rem_total = self._free() + self._radix.evictable_size - rnd.offset
        if extend + reserve + match.host_len >= rem_total and not force:
            self._radix.unlock(match.host_node)
            return False
        chunk = min(extend, rnd.rem_chunk)
        self._ensure_free(match.host_len + chunk)
        if match.host_len:
            self._radix.load_back(match.host_node)
            self._c["host_hit_tokens_total"] += match.host_len
        req.node, req.locked_len, req.target, req.filled = match.host_node, prefix, len(seq_now), prefix
        req.cached += prefix
        if req.admitted_s is None:
            req.admitted_s = self._now_s
        rnd.offset += reserve if chunk == extend else 0
        rnd.prefix_tokens += prefix
        rnd.host_tokens += match.host_len
        self._c["cached_prefill_tokens_total"] += prefix
        self._fill(req, chunk, rnd)
        rnd.admitted.append(req)
        return True

    def _continue_chunk(self, req: _Req, rnd: _Round) -> None:
        """Next chunk of the in-flight chunked request (SGLang add_chunked_req)."""
        room = self._free() + self._radix.evictable_size
        chunk = min(req.target - req.filled, rnd.rem_chunk, room)
        if chunk <= 0:
            return  # no room: decode runs instead and frees memory
        self._ensure_free(chunk)
        self._chunked = None
        rnd.prefix_tokens += req.filled
        self._fill(req, chunk, rnd)
        rnd.admitted.append(req)

    def _fill(self, req: _Req, chunk: int, rnd: _Round) -> None:
        req.private += chunk
        req.filled += chunk
        self._private += chunk
        rnd.rem_chunk -= chunk
        rnd.prefill_tokens += chunk
        self._c["computed_prefill_tokens_total"] += chunk
        if req.retractions:
            self._c["recomputed_prefill_tokens_total"] += chunk

    def _complete_prefill(self, req: _Req) -> None:
        """Insert the prefilled sequence into the cache and lock it (cache_unfinished_req)."""
        node, _ = self._radix.insert(req.seq[: req.target], self._now_s)
        self._radix.lock(node)
        if req.node is not None:
            self._radix.unlock(req.node)
        # The tree now owns every prefilled token; copies another request already
        # inserted are freed, as SGLang frees duplicate indices on insert.
        self._private -= req.private
        req.node, req.locked_len, req.private = node, req.target, 0
        self._running.append(req)

    # ---- decode ---------------------------------------------------------------

    def _decode_iteration(self, finished: list[FinishedRequest]) -> StepResult:
        k = self.config.num_continuous_decode_steps
        need = sum(min(k, r.out_len - r.generated) for r in self._running)
        retracted: list[_Req] = []
        if self._ensure_free(need):
            self.new_token_ratio = max(self.new_token_ratio - self._ratio_decay, self._min_ratio)
        else:
            retracted = self._retract(k, finished)
            need = sum(min(k, r.out_len - r.generated) for r in self._running)
        new_tokens, dt = self._generate(k)
        self._private += need
        self._advance(dt)
        self._note_throughput(need)
        done = [r for r in self._running if r.generated == r.out_len]
        if done:
            self._running = [r for r in self._running if r.generated < r.out_len]
            self._batch_is_full = False
            finished.extend(self._finish(r) for r in done)
        self._c["decode_steps_total"] += 1
        return StepResult(dt, new_tokens, finished, [r.rid for r in retracted], 0, len(new_tokens))

    def _generate(self, k: int) -> tuple[dict[str, int], float]:
        """Give every running request up to k tokens; returns them and the time of k passes."""
        new_tokens: dict[str, int] = {}
        active_per_pass = [0] * k
        kv_tokens = 0
        for r in self._running:
            t = min(k, r.out_len - r.generated)
            kv_tokens += r.prompt_len + r.generated
            r.generated += t
            r.private += t
            new_tokens[r.rid] = t
            active_per_pass[t - 1] += 1
        dt, active, batch = 0.0, 0, len(self._running)
        for j in range(k - 1, -1, -1):  # pass j runs the requests with more than j tokens to go
            active += active_per_pass[j]
            kv_j = kv_tokens * active / batch + (j + 1) * active if batch else 0
            dt += self.profile.step_time_s(active, int(kv_j), 0) if active else 0.0
        return new_tokens, dt

    def _retract(self, k: int, finished: list[FinishedRequest]) -> list[_Req]:
        """SGLang retract_decode: fewest generated (then longest prompt) go first."""
        order = sorted(self._running, key=lambda r: (r.generated, -r.prompt_len), reverse=True)
        need = sum(min(k, r.out_len - r.generated) for r in order)
        retracted: list[_Req] = []
        while len(order) > 1:
            req = order.pop()
            need -= min(k, req.out_len - req.generated)
            self._release(req)
            retracted.append(req)
            if self._ensure_free(need):
                break
        if not self._ensure_free(need):  # even one request cannot fit: abort it (as SGLang)
            last = order.pop()
            self._release(last)
            finished.append(self._record(last, "abort"))
        kept = set(map(id, order))
        self._running = [r for r in self._running if id(r) in kept]
        self._requeue(retracted)
        gen = sum(r.generated for r in self._running)
        max_new = sum(r.max_new for r in self._running)
        self.new_token_ratio = min(1.0, (gen + RETRACT_DECODE_STEPS * len(self._running)) / (max_new + 1))
        return retracted

    def _requeue(self, retracted: list[_Req]) -> None:
        for req in retracted:
            req.retractions += 1
            self._c["retracted_tokens_total"] += req.prompt_len + req.generated
        self._c["num_retracted_requests_total"] += len(retracted)
        self._waiting.extend(retracted)
        self._batch_is_full = False

    # ---- bookkeeping ----------------------------------------------------------

    def _finish(self, req: _Req) -> FinishedRequest:
        """Insert prompt + output into the cache, unlock, report (cache_finished_req)."""
        self._radix.insert(req.seq, self._now_s)
        self._private -= req.private
        req.private = 0
        self._release(req)
        return self._record(req, req.reason)

    def _release(self, req: _Req) -> None:
        """Free the request's private KV and unpin its cached prefix (no insert)."""
        self._private -= req.private
        req.private = 0
        if req.node is not None:
            self._radix.unlock(req.node)
        req.node, req.locked_len = None, 0

    def _record(self, req: _Req, reason: str) -> FinishedRequest:
        del self._by_rid[req.rid]
        self._c["prompt_tokens_total"] += req.prompt_len
        self._c["generation_tokens_total"] += req.generated
        self._c["cached_tokens_total"] += req.cached
        admitted = self._now_s if req.admitted_s is None else req.admitted_s
        return FinishedRequest(
            rid=req.rid,
            prompt_tokens=req.prompt_len,
            completion_tokens=req.generated,
            cached_tokens=req.cached,
            retractions=req.retractions,
            finish_reason=reason,
            queue_time_s=admitted - req.arrival_s,
            e2e_latency_s=self._now_s - req.arrival_s,
        )

    def _free(self) -> int:
        return self.config.max_total_num_tokens - self._radix.device_size - self._private

    def _ensure_free(self, tokens: int) -> bool:
        """Evict unreferenced cache until `tokens` are free; False if impossible."""
        short = tokens - self._free()
        if short > 0:
            self._radix.evict(short)
        return self._free() >= tokens

    def _advance(self, dt_s: float) -> None:
        self._now_s += dt_s
        self._c["steps_total"] += 1
        self._window[1] += dt_s

    def _note_throughput(self, tokens: int) -> None:
        """SGLang recomputes gen_throughput every decode_log_interval decode iterations
        over the wall time since the last one (prefill iterations included)."""
        self._window[0] += tokens
        self._c["decode_tokens_total"] += tokens
        self._window[2] += 1
        if self._window[2] >= DECODE_LOG_INTERVAL:
            tokens_w, seconds_w, _ = self._window
            self.last_gen_throughput = tokens_w / seconds_w if seconds_w > 0 else 0.0
            self._window = [0, 0.0, 0]


_COUNTERS = (
    "num_requests_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "cached_tokens_total",
    "num_retracted_requests_total",
    "retracted_tokens_total",  # prompt + generated of each retracted request (to recompute)
    "recomputed_prefill_tokens_total",  # prefill actually recomputed after retractions
    "computed_prefill_tokens_total",  # every prefilled (uncached) token
    "cached_prefill_tokens_total",  # prefix hits at every admission (device + host)
    "host_hit_tokens_total",  # hits loaded back from the hicache host tier
    "decode_tokens_total",  # tokens produced by decode iterations, as they happen
    "steps_total",
    "prefill_steps_total",
    "decode_steps_total",
)
