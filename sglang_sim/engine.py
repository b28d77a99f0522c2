"""Discrete-time model of SGLang's scheduler: KV pool, admission, decode, retraction.

Pure and synchronous: no clock, no I/O. The HTTP front calls `step()` in a loop
and turns each `StepResult` into streamed tokens and finished responses.

What it mirrors, checked against SGLang 0.5.17's wheel (python/sglang/srt/; file:line there):
- One scheduler iteration is either a prefill batch or a decode batch; prefill
  wins whenever something can be admitted (managers/scheduler.py:3017-3043
  get_next_batch_to_run). No prefill round is tried while `batch_is_full` is set
  or nothing waits, unless a chunked prefill is in flight (scheduler.py:3111-3114).
- Admission is FCFS (the default `--schedule-policy fcfs`, server_args.py:819-834, leaves the queue
  in arrival order: schedule_policy.py:203-208; retracted requests are appended) through PrefillAdder
  (managers/schedule_policy.py:444-1255):
  * rem_total_tokens = free + evictable - offset (schedule_policy.py:568-590), where the
    offset starts as sum over running of min(max_new - generated, CLIP) * new_token_ratio
    (schedule_policy.py:490-497, 559-566), CLIP = SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096
    (schedule_policy.py:69-71).
  * a candidate needs extend + min(max(max_new - generated, 0), CLIP) + page_size
    < rem_total_tokens (schedule_policy.py:1077-1095; re-checked after locking its prefix,
    1125-1128), else NO_TOKEN; extend counts host-cached tokens too (they are loaded back).
  * once admitted, it adds extend + min(max_new, CLIP) + page_size to the offset: its whole
    clipped max_new, no ratio, not the remaining part (schedule_policy.py:741-768, 1203-1212).
  * budget_state after each admission (schedule_policy.py:718-739): NO_TOKEN once
    rem_total_tokens <= 0; OTHER once the chunk budget (chunked_prefill_size) or the input
    budget (max_prefill_tokens, 16384) is spent.
  * NO_TOKEN sets `batch_is_full` (scheduler.py:3238-3246; with hicache only if something is
    admitted or running, 3240-3244), as does reaching max_running_requests (3202-3204).
  * `batch_is_full` is cleared when the running batch shrinks: a request finished (seen by
    the next decode's filter_batch, scheduler.py:3383-3390, 3458-3459: one decode after the
    finish), a retraction (3458-3459), or a prefill batch that carried an unfinished chunk
    (filtered out of it, 2990-2994). A prefill batch that lands on an EMPTY running batch
    becomes the running batch with batch_is_full = False (2997-2999; ScheduleBatch's default,
    schedule_batch.py:1949): so after a start the first round (each candidate reserving its
    whole clipped max_new) is followed at once by a second round at the running ratio.
- A prompt longer than the round's chunk budget is prefilled in chunks over
  consecutive iterations (one chunked request at a time; scheduler.py:3177-3179,
  schedule_policy.py:1213-1253); the next chunk takes min(chunk budget, rem_total_tokens),
  the chunk budget when that is <= 0 (schedule_policy.py:868-917). Decode waits meanwhile.
- Decode (scheduler.py:3383-3466): each running request gains `num_continuous_decode_steps`
  tokens, as earlier SGLang schedulers ran it. 0.5.17 parses the flag and never reads it (one step
  an iteration; tune skips the lever, tests/contract checks it); the calibration's k = 4 is kept:
  k forward passes are charged for k tokens (throughput about the same; admission every k steps).
  When the pool (after evicting unreferenced cache) cannot hold them
  (schedule_batch.py:2727-2732 check_decode_mem), retract_decode (schedule_batch.py:2734-2823)
  runs: sort by (len(output), -len(prompt)) descending, pop from the end (fewest generated
  first), at least one, until the rest fit; the last survivor is aborted if even it cannot
  fit. Retracted requests keep their generated tokens, free their KV without inserting it
  into the cache and are appended to the END of the waiting queue (scheduler.py:3453-3454).
  On re-admission prompt + generated is prefilled again minus any cached prefix.
- new_token_ratio (managers/scheduler_components/new_token_ratio_tracker.py:20-51): init =
  min(0.7 * conservativeness, 1), min = init * 0.14, linear decay of (init - min) / 600 per
  decode iteration without retraction (scheduler.py:3455-3456); after a retraction
  min(1, (sum generated + 20 * n) / (sum max_new + 1)) over the requests left running.
  /metrics' `sglang:new_token_ratio` is the ratio of the LAST PREFILL round
  (scheduler_components/metrics_reporter.py:553, 82): `reported_new_token_ratio` here.
- token_usage = (pool - available - evictable) / pool (scheduler_components/
  pool_stats_observer.py:216-223): running requests' KV, not their reservation.
- After a prefill the request's sequence is inserted into the radix cache and
  locked (cache_unfinished_req); on finish prompt + output is inserted
  (cache_finished_req) and unlocked, so a follow-up turn finds it cached.

Simplifications (documented, observable only in latency): the first output
token comes from the first decode iteration rather than the prefill pass; a
decode iteration of k continuous steps is charged as k forward passes; no
overlap scheduler (its one-iteration lag is below the step time).

Layout: engine_request (config, request record, admission arithmetic), kv_pool
(KV accounting over the radix cache), engine_stats (counters, /v1/loads).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sglang_sim.engine_request import (
    CLIP_MAX_NEW_TOKENS,
    EngineConfig,
    FinishedRequest,
    PrefillRound,
    SchedReq,
    StepResult,
    admitted_reserve,
    clipped_reserve,
    decode_need,
    derive_max_running_requests,
    finished_record,
    ratio_after_retract,
    running_reservation,
    validate_request,
)
from sglang_sim.engine_stats import EngineStats, build_loads
from sglang_sim.kv_pool import KVPool
from sglang_sim.profiles import HardwareProfile

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "Engine",
    "EngineConfig",
    "FinishedRequest",
    "StepResult",
    "derive_max_running_requests",
]


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
        self.reported_new_token_ratio = self._init_ratio  # /metrics: the last prefill round's
        self._pool = KVPool(config.max_total_num_tokens, config.hicache_tokens)
        self._waiting: deque[SchedReq] = deque()
        self._running: list[SchedReq] = []
        self._chunked: SchedReq | None = None
        self._by_rid: dict[str, SchedReq] = {}
        self._now_s = 0.0
        self._batch_is_full = False
        self._unfull_at_decode = False  # a finish clears batch_is_full at the next decode's filter
        self._pending: list[FinishedRequest] = []
        self._stats = EngineStats()

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
        return self._pool.cache_tokens()

    @property
    def used_tokens(self) -> int:
        """KV tokens in the pool: running requests plus the whole prefix cache."""
        return self._pool.used_tokens

    @property
    def last_gen_throughput(self) -> float:
        """SGLang's gen_throughput (tokens/s) over the last decode_log_interval window."""
        return self._stats.last_gen_throughput

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
        if rid in self._by_rid:
            raise ValueError(f"Duplicate request rid {rid!r}: a request with this id is still running.")
        validate_request(self.config, len(prompt_ids), len(output_ids), max_new)
        req = SchedReq(
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
        self._stats.add("num_requests_total")

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
        self._pool.release(req)
        self._pending.append(self._record(req, "abort"))
        return True

    def step(self) -> StepResult:
        """Run one scheduler iteration: a prefill batch if anything can be admitted,
        else a decode batch of every running request; idle steps take 0 s."""
        finished, self._pending = self._pending, []
        if self._unfull_at_decode and not self._running:  # nothing left to decode: filtered at once
            self._batch_is_full = self._unfull_at_decode = False
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
        self._pool.radix.reset()
        self.new_token_ratio = self.reported_new_token_ratio = self._init_ratio
        return True

    def loads(self) -> dict:
        """One dp rank's entry of SGLang's `/v1/loads` (managers/load_snapshot.py keys)."""
        return build_loads(self._pool, self._stats, self.num_running, self._waiting, self.max_running_requests)

    def counters(self) -> dict:
        """Cumulative counters; prompt/generation/cached totals count finished requests
        (as SGLang's tokenizer-side metrics do), the rest count as events happen."""
        return dict(self._stats.counters)

    # ---- prefill --------------------------------------------------------------

    def _prefill_iteration(self, finished: list[FinishedRequest]) -> StepResult | None:
        cfg = self.config
        offset = running_reservation(self._running, cfg.clip_max_new_tokens, self.new_token_ratio)
        rnd = PrefillRound(rem_chunk=cfg.chunked_prefill_size, rem_input=cfg.max_prefill_tokens, offset=offset)
        was_empty = not self._running
        if self._chunked is not None:
            self._continue_chunk(self._chunked, rnd)
        if self._chunked is None and self._waiting and not self._batch_is_full:
            self._admit_waiting(rnd)
        if not rnd.admitted:
            return None
        done = []
        for req in rnd.admitted:
            if req.filled == req.target:
                self._pool.commit_prefill(req, self._now_s)
                self._running.append(req)
                done.append(req)
            else:
                self._chunked = req
        # The batch, minus an unfinished chunk, merges into the running batch; one that lands on an
        # empty running batch replaces it (batch_is_full False), and a batch that shrank by its
        # chunk clears it too (scheduler.py:2990-2999).
        if (was_empty and done) or self._chunked is not None:
            self._batch_is_full = False
        self.reported_new_token_ratio = self.new_token_ratio
        dt = self.profile.step_time_s(len(rnd.admitted), rnd.prefix_tokens, rnd.prefill_tokens)
        dt += rnd.host_tokens * self.profile.hicache_load_per_token_s
        self._advance(dt)
        self._stats.add("prefill_steps_total")
        self._stats.add("prefill_busy_us_total", round(dt * 1e6))
        self._stats.log_stats()
        return StepResult(dt, {}, finished, [], rnd.prefill_tokens, 0)

    def _rem_total(self, rnd: PrefillRound) -> float:
        """PrefillAdder.rem_total_tokens (this round's prefill tokens are already allocated)."""
        return self._pool.free() + self._pool.radix.evictable_size - rnd.offset

    def _admit_waiting(self, rnd: PrefillRound) -> None:
        """PrefillAdder loop: FCFS until a candidate does not fit or budgets run out."""
        while self._waiting:
            if len(self._running) + len(rnd.admitted) >= self.max_running_requests:
                self._batch_is_full = True
                return
            req = self._waiting[0]
            alone = not self._running and not rnd.admitted
            result = self._try_admit(req, rnd, force=alone)
            if result == "no_token":
                if rnd.admitted or self._running or not self.config.hicache_tokens:
                    self._batch_is_full = True
                return
            if result == "other":
                return
            self._waiting.popleft()
            # budget_state (schedule_policy.py:718-739) after each admission
            if self._rem_total(rnd) <= 0:
                self._batch_is_full = True
                return
            if rnd.rem_chunk <= 0 or rnd.rem_input <= 0 or req.filled < req.target:
                return

    def _try_admit(self, req: SchedReq, rnd: PrefillRound, force: bool) -> str:
        """add_one_req: admit `req` ("ok") if extend + clipped remaining max_new + a page fit
        rem_total_tokens, else "no_token"; "other" when it fits but no chunk budget is left.

        `force` admits a request alone on an empty engine even past the reservation
        (SGLang would wait forever; the pool physically holds it, see validate_request)."""
        radix, page, clip = self._pool.radix, self.config.page_size, self.config.clip_max_new_tokens
        seq_now = req.seq[: req.prompt_len + req.generated]
        # At least one token is always computed (SGLang caps the prefix at len - 1).
        match = radix.match_prefix(seq_now[:-1], self._now_s)
        radix.lock(match.host_node)  # pin before measuring evictable (SGLang _lock_node)
        prefix = match.device_len + match.host_len
        extend = len(seq_now) - prefix
        if extend + match.host_len + clipped_reserve(req, clip) + page >= self._rem_total(rnd) and not force:
            radix.unlock(match.host_node)
            return "no_token"
        chunk = min(extend, rnd.rem_chunk)
        if chunk <= 0:  # a chunk continued this round took the budget (schedule_policy.py:1214-1218)
            radix.unlock(match.host_node)
            return "other"
        self._pool.ensure_free(match.host_len + chunk)
        if match.host_len:
            radix.load_back(match.host_node)
            self._stats.add("host_hit_tokens_total", match.host_len)
        req.node, req.locked_len, req.target, req.filled = match.host_node, prefix, len(seq_now), prefix
        if not req.retractions:  # SGLang 0.5.17 counts a request's cache hit once, before any retraction
            req.cached += prefix  # (schedule_batch.py: `if not req.retracted_stain`; chunks add 0 after the first)
        if req.admitted_s is None:
            req.admitted_s = self._now_s
        rnd.offset += page + (admitted_reserve(req, clip) if chunk == extend else 0)
        rnd.prefix_tokens += prefix
        rnd.host_tokens += match.host_len
        self._stats.add("cached_prefill_tokens_total", prefix)
        self._fill(req, chunk, rnd)
        rnd.admitted.append(req)
        return "ok"

    def _continue_chunk(self, req: SchedReq, rnd: PrefillRound) -> None:
        """Next chunk of the in-flight chunked request (SGLang add_chunked_req, schedule_policy.py:868-917):
        min(chunk budget, rem_total_tokens), the chunk budget when that is <= 0; never more than the
        pool physically holds (SGLang would fail to allocate)."""
        budget = min(rnd.rem_chunk, int(self._rem_total(rnd)))
        if budget <= 0:
            budget = rnd.rem_chunk
        room = self._pool.free() + self._pool.radix.evictable_size
        chunk = min(req.target - req.filled, budget, room)
        if chunk <= 0:
            return  # no room: decode runs instead and frees memory
        self._pool.ensure_free(chunk)
        self._chunked = None
        last = req.filled + chunk == req.target
        rnd.offset += self.config.page_size + (admitted_reserve(req, self.config.clip_max_new_tokens) if last else 0)
        rnd.prefix_tokens += req.filled
        self._fill(req, chunk, rnd)
        rnd.admitted.append(req)

    def _fill(self, req: SchedReq, chunk: int, rnd: PrefillRound) -> None:
        self._pool.grow(req, chunk)
        req.filled += chunk
        rnd.rem_chunk -= chunk
        rnd.rem_input -= chunk
        rnd.prefill_tokens += chunk
        self._stats.add("computed_prefill_tokens_total", chunk)
        if req.retractions:
            self._stats.add("recomputed_prefill_tokens_total", chunk)

    # ---- decode ---------------------------------------------------------------

    def _decode_iteration(self, finished: list[FinishedRequest]) -> StepResult:
        k = self.config.num_continuous_decode_steps
        retracted: list[SchedReq] = []
        if self._unfull_at_decode:  # filter_batch drops last step's finished requests
            self._batch_is_full = self._unfull_at_decode = False
        if self._pool.ensure_free(decode_need(self._running, k)):
            self.new_token_ratio = max(self.new_token_ratio - self._ratio_decay, self._min_ratio)
        else:
            retracted = self._retract(k, finished)
        need = decode_need(self._running, k)
        new_tokens, dt, graph = self._generate(k)
        self._advance(dt)
        self._stats.count_decode(need)
        done = [r for r in self._running if r.generated == r.out_len]
        if done:
            self._running = [r for r in self._running if r.generated < r.out_len]
            self._unfull_at_decode = True
            finished.extend(self._finish(r) for r in done)
        self._stats.add("decode_steps_total")
        self._stats.add("decode_cuda_graph_passes_total" if graph else "decode_none_passes_total")
        return StepResult(dt, new_tokens, finished, [r.rid for r in retracted], 0, len(new_tokens), graph)

    def _generate(self, k: int) -> tuple[dict[str, int], float, bool]:
        """Give every running request up to k tokens; returns them, the time of k passes and whether the
        first pass (the whole batch) ran on a CUDA graph."""
        new_tokens: dict[str, int] = {}
        active_per_pass = [0] * k
        kv_tokens = 0
        for r in self._running:
            t = min(k, r.out_len - r.generated)
            kv_tokens += r.prompt_len + r.generated
            r.generated += t
            self._pool.grow(r, t)
            new_tokens[r.rid] = t
            active_per_pass[t - 1] += 1
        dt, active, batch = 0.0, 0, len(self._running)
        ceiling = self.config.cuda_graph_max_bs
        for j in range(k - 1, -1, -1):  # pass j runs the requests with more than j tokens to go
            active += active_per_pass[j]
            kv_j = kv_tokens * active / batch + (j + 1) * active if batch else 0
            graph = ceiling is None or active <= ceiling  # cuda_graph_runner.can_run: bs <= max captured bs
            dt += self.profile.step_time_s(active, int(kv_j), 0, graph) if active else 0.0
        return new_tokens, dt, ceiling is None or batch <= ceiling

    def _retract(self, k: int, finished: list[FinishedRequest]) -> list[SchedReq]:
        """SGLang retract_decode: fewest generated (then longest prompt) go first."""
        order = sorted(self._running, key=lambda r: (r.generated, -r.prompt_len), reverse=True)
        need = decode_need(order, k)
        retracted: list[SchedReq] = []
        while len(order) > 1:
            req = order.pop()
            need -= min(k, req.out_len - req.generated)
            self._pool.release(req)
            retracted.append(req)
            if self._pool.ensure_free(need):
                break
        if not self._pool.ensure_free(need):  # even one request cannot fit: abort it (as SGLang)
            last = order.pop()
            self._pool.release(last)
            finished.append(self._record(last, "abort"))
        kept = set(map(id, order))
        self._running = [r for r in self._running if id(r) in kept]
        self._requeue(retracted)
        self.new_token_ratio = ratio_after_retract(self._running)
        return retracted

    def _requeue(self, retracted: list[SchedReq]) -> None:
        for req in retracted:
            req.retractions += 1
            self._stats.add("retracted_tokens_total", req.prompt_len + req.generated)
        self._stats.note_retraction(len(retracted))
        self._waiting.extend(retracted)
        self._batch_is_full = False

    # ---- bookkeeping ----------------------------------------------------------

    def _finish(self, req: SchedReq) -> FinishedRequest:
        """Insert prompt + output into the cache, unlock, report (cache_finished_req)."""
        self._pool.finish(req, self._now_s)
        return self._record(req, req.reason)

    def _record(self, req: SchedReq, reason: str) -> FinishedRequest:
        del self._by_rid[req.rid]
        self._stats.count_finished(req)
        return finished_record(req, reason, self._now_s)

    def _advance(self, dt_s: float) -> None:
        self._now_s += dt_s
        self._stats.count_step(dt_s)
