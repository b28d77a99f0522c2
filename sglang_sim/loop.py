"""The one asyncio task that owns the engine: steps it, paces simulated time against real
time (`time_scale` simulated seconds per real second), hands tokens and results to the
HTTP handlers, and writes SGLang-style scheduler log lines."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_sim.engine import Engine, EngineConfig, FinishedRequest, StepResult
from sglang_sim.profiles import default_cuda_graph_max_bs, get_profile, hicache_capacity_tokens, kv_capacity_tokens

log = logging.getLogger("sglang_sim")

DEFAULT_MEM_FRACTION = 0.88  # what SGLang picks for a large TP8 model on 141 GB GPUs (seed run)
DEFAULT_CHUNKED_PREFILL = 8192  # SGLang picks 2048..16384 by GPU memory (server_args.py); the seed ran 8192
DEFAULT_CONTEXT_LEN = 131072
# Behind by more than this (real seconds), the loop stops trying to catch up: the sim clock
# then runs slower than real time x scale, and the shortfall is counted as lag.
_REANCHOR_LAG_S = 0.05
ADMISSIONS_KEPT = 5000


def build_engine(ns: argparse.Namespace) -> tuple[Engine, dict[str, Any]]:
    """Engine from the parsed flags, plus the resolved capacity figures. Raises ValueError."""
    mem = ns.mem_fraction_static if ns.mem_fraction_static is not None else DEFAULT_MEM_FRACTION
    ns.mem_fraction_static = mem
    ns.chunked_prefill_size = ns.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL
    ns.context_length = ns.context_length or DEFAULT_CONTEXT_LEN
    pool = ns.max_total_tokens or kv_capacity_tokens(ns.sim_profile, mem, ns.kv_cache_dtype)
    hicache = 0
    if ns.enable_hierarchical_cache:
        # --hicache-size is GB per rank; 0 means hicache_ratio x the device pool (SGLang's rule).
        hicache = (hicache_capacity_tokens(ns.sim_profile, ns.hicache_size, ns.kv_cache_dtype)
                   if ns.hicache_size > 0 else int(pool * ns.hicache_ratio))
    profile = get_profile(ns.sim_profile, ns.kv_cache_dtype)
    if getattr(ns, "sim_no_graph_factor", None) is not None:
        profile = replace(profile, no_graph_step_factor=ns.sim_no_graph_factor)
    config = EngineConfig(
        max_total_num_tokens=pool,
        cuda_graph_max_bs=cuda_graph_max_bs(ns, profile.gpu_mem_gb),
        max_running_requests=ns.max_running_requests or 0,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        page_size=max(1, ns.page_size),
        num_continuous_decode_steps=ns.num_continuous_decode_steps,
        hicache_tokens=hicache,
        schedule_conservativeness=ns.schedule_conservativeness,
        context_length=ns.context_length,
    )
    engine = Engine(config, profile)
    info = {
        "max_total_num_tokens": pool,
        "max_running_requests": engine.max_running_requests,
        "chunked_prefill_size": ns.chunked_prefill_size,
        "max_prefill_tokens": ns.max_prefill_tokens,
        "context_len": ns.context_length,
        "max_req_input_len": ns.context_length - 1,
        "hicache_tokens": hicache,
        "cuda_graph_max_bs": config.cuda_graph_max_bs,
    }
    return engine, info


def cuda_graph_max_bs(ns: argparse.Namespace, gpu_mem_gb: float) -> int:
    """The decode CUDA-graph ceiling SGLang 0.5.17 resolves: --cuda-graph-max-bs(-decode), else its default
    for the GPU's memory and TP size; 0 with --disable-cuda-graph (every decode step runs eagerly)."""
    if ns.disable_cuda_graph:
        return 0
    return ns.cuda_graph_max_bs_decode or default_cuda_graph_max_bs(gpu_mem_gb, ns.tp_size)


@dataclass(eq=False)
class Ticket:
    """One request in the engine: `done` resolves with its FinishedRequest; when streaming,
    `tokens` receives token counts as they are produced, then the FinishedRequest."""

    rid: str
    done: asyncio.Future[FinishedRequest]
    tokens: asyncio.Queue[int | FinishedRequest] | None = None

    def stream(self) -> asyncio.Queue[int | FinishedRequest]:
        """The token queue of a request submitted with stream=True."""
        if self.tokens is None:
            raise RuntimeError(f"request {self.rid} was not submitted with stream=True")
        return self.tokens


@dataclass
class LoopStats:
    steps: int = 0
    lag_events: int = 0
    lag_total_real_s: float = 0.0
    max_lag_real_s: float = 0.0
    busy_real_s: float = 0.0
    busy_sim_s: float = 0.0  # simulated seconds the engine spent in steps (the GPU's busy time)
    max_step_real_s: float = 0.0
    last_gen_throughput: float = 0.0
    retraction_events: int = 0
    last_cuda_graph: bool = True  # the last decode batch ran on a CUDA graph (sglang:is_cuda_graph)
    # (simulated s, running) after each prefill round, the first ADMISSIONS_KEPT: a run's ramp in the
    # simulator's own clock (tests compare the controller's ramp with a fixed window's on it)
    admissions: list[tuple[float, int]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class EngineLoop:
    """Owns `engine`; every other coroutine talks to it through submit/abort/now_s."""

    def __init__(self, engine: Engine, *, time_scale: float, decode_log_interval: int = 40) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.decode_log_interval = max(1, decode_log_interval)
        self.stats = LoopStats()
        self._tickets: dict[str, Ticket] = {}
        self._streams: dict[str, asyncio.Queue[int | FinishedRequest]] = {}  # rid -> its ticket's tokens
        self._wake = asyncio.Event()
        self._step_pending = False  # an abort left a result that only the next step() reports
        self._anchor_real = time.monotonic()
        self._anchor_sim = engine.now_s
        self._decode_steps = 0
        self._log_tokens = 0
        self._log_sim_s = engine.now_s
        self.on_finished: Callable[[FinishedRequest], None] | None = None  # every request that ended (aborts too)
        self._running = asyncio.Event()  # cleared: the scheduler is hung (faults.scheduler_hung), no step
        self._running.set()

    def set_hung(self, hung: bool) -> None:
        """Stop stepping (an NCCL hang) or go on."""
        if hung:
            self._running.clear()
        else:
            self._running.set()

    # -- used by the handlers ------------------------------------------------------------
    def now_s(self) -> float:
        """Simulated seconds; while idle the clock follows real time x scale."""
        if self.engine.idle:
            self._catch_up()
        return self.engine.now_s

    def submit(self, rid: str, prompt_ids: Sequence[int], output_ids: Sequence[int], finish_reason: str,
               max_new_tokens: int, stream: bool) -> Ticket:
        """Queue a request. Raises ValueError when it can never fit (the front answers 400)."""
        if self.engine.idle:
            self._catch_up()
        self.engine.add_request(rid, prompt_ids, output_ids, finish_reason, max_new_tokens=max_new_tokens)
        ticket = Ticket(rid, asyncio.get_running_loop().create_future(), asyncio.Queue() if stream else None)
        self._tickets[rid] = ticket
        if ticket.tokens is not None:
            self._streams[rid] = ticket.tokens
        self._wake.set()
        return ticket

    def abort(self, rid: str) -> bool:
        """Abort `rid` (its KV is freed); its ticket resolves with finish_reason "abort"."""
        found = self.engine.abort(rid)
        if found:
            self._step_pending = True
            self._wake.set()
        return found

    def abort_all(self) -> int:
        return sum(self.abort(rid) for rid in list(self._tickets))

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    # -- the task ------------------------------------------------------------------------
    async def run(self) -> None:
        """Step the engine forever (cancel to stop)."""
        while True:
            await self._running.wait()
            if self.engine.idle and not self._step_pending:
                self._wake.clear()
                await self._wake.wait()
                self._catch_up()
                self._anchor_real, self._anchor_sim = time.monotonic(), self.engine.now_s
                continue
            t0 = time.monotonic()
            ratio_before = self.engine.new_token_ratio
            result = self.engine.step()
            self._step_pending = False
            step_real_s = time.monotonic() - t0
            self.stats.busy_real_s += step_real_s
            self.stats.busy_sim_s += result.dt_s
            self.stats.max_step_real_s = max(self.stats.max_step_real_s, step_real_s)
            self.stats.steps += 1
            await self._pace()
            self._dispatch(result)
            self._log_step(result, ratio_before)
            if result.prefill_tokens and len(self.stats.admissions) < ADMISSIONS_KEPT:
                self.stats.admissions.append((round(self.engine.now_s, 4), self.engine.num_running))

    async def _pace(self) -> None:
        target = self._anchor_real + (self.engine.now_s - self._anchor_sim) / self.time_scale
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            return
        lag = -delay
        self.stats.max_lag_real_s = max(self.stats.max_lag_real_s, lag)
        if lag > _REANCHOR_LAG_S:
            self.stats.lag_events += 1
            self.stats.lag_total_real_s += lag
            self._anchor_real, self._anchor_sim = time.monotonic(), self.engine.now_s
        await asyncio.sleep(0)  # let the HTTP handlers run even when behind

    def _catch_up(self) -> None:
        target = self._anchor_sim + (time.monotonic() - self._anchor_real) * self.time_scale
        if target > self.engine.now_s:
            self.engine.advance_idle(target - self.engine.now_s)

    def _dispatch(self, result: StepResult) -> None:
        if self._streams:
            new_tokens = result.new_tokens
            for rid, tokens in self._streams.items():
                n = new_tokens.get(rid)
                if n:
                    tokens.put_nowait(n)
        for fin in result.finished:
            if self.on_finished is not None:
                self.on_finished(fin)
            ticket = self._tickets.pop(fin.rid, None)
            if ticket is None:
                continue
            self._streams.pop(fin.rid, None)
            if ticket.tokens is not None:
                ticket.tokens.put_nowait(fin)
            if not ticket.done.done():
                ticket.done.set_result(fin)

    def _log_step(self, result: StepResult, ratio_before: float) -> None:
        if result.retracted:
            self.stats.retraction_events += 1
            log.info("KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_token_ratio: %.4f -> %.4f",
                     len(result.retracted), ratio_before, self.engine.new_token_ratio)
        if not result.decode_batch:
            return
        self.stats.last_cuda_graph = result.cuda_graph
        self._decode_steps += 1
        self._log_tokens += sum(result.new_tokens.values())
        if self._decode_steps % self.decode_log_interval:
            return
        dt = self.engine.now_s - self._log_sim_s
        self.stats.last_gen_throughput = self._log_tokens / dt if dt > 0 else 0.0
        self._log_tokens, self._log_sim_s = 0, self.engine.now_s
        loads = self.engine.loads()
        # SGLang 0.5.17 managers/scheduler_components/metrics_reporter.py report_decode_stats: the flag is
        # can_run_cuda_graph of the batch that logged
        log.info("Decode batch, #running-req: %d, #token: %d, token usage: %.2f, cuda graph: %s, "
                 "gen throughput (token/s): %.2f, #queue-req: %d",
                 loads["num_running_reqs"], loads["num_used_tokens"], loads["token_usage"], result.cuda_graph,
                 self.stats.last_gen_throughput, loads["num_waiting_reqs"])
