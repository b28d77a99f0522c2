"""The engine's reporting: cumulative counters, the gen_throughput window and the
`/v1/loads` entry (SGLang python/sglang/srt/managers/load_snapshot.py keys).

Pure: no clock, no I/O; time is the engine's simulated seconds.
"""

from __future__ import annotations

from collections.abc import Collection

from sglang_sim.engine_request import SchedReq
from sglang_sim.kv_pool import KVPool

__all__ = ["COUNTERS", "DECODE_LOG_INTERVAL", "EngineStats", "build_loads"]

DECODE_LOG_INTERVAL = 40  # server_args.decode_log_interval: gen_throughput is per window

COUNTERS = (
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
    "prefill_busy_us_total",  # simulated microseconds spent in prefill iterations
    "decode_steps_total",
    # SGLang's sglang:cuda_graph_passes_total{mode="decode_cuda_graph"|"decode_none"} (0.5.17)
    "decode_cuda_graph_passes_total",
    "decode_none_passes_total",
)


class EngineStats:
    """Counters named in COUNTERS plus SGLang's windowed gen_throughput (tokens/s)."""

    def __init__(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_gen_throughput = 0.0
        self._window = [0, 0.0, 0]  # gen tokens, seconds, decode iterations since last log
        # SGLang's `sglang:num_retracted_reqs` gauge (and /v1/loads queues.retracted): the size
        # of the latest retraction since the previous stats log, published at each log, then 0
        # (managers/scheduler_components/metrics_reporter.py, 0.5.17).
        self.num_retracted_reqs = 0
        self._retracted_latest = 0

    def note_retraction(self, n: int) -> None:
        """retract_decode took `n` requests back (SGLang overwrites, it does not add)."""
        self._retracted_latest = n
        self.counters["num_retracted_requests_total"] += n

    def log_stats(self) -> None:
        """A scheduler stats log (every prefill batch, every DECODE_LOG_INTERVAL decodes)."""
        self.num_retracted_reqs, self._retracted_latest = self._retracted_latest, 0

    def add(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def count_step(self, dt_s: float) -> None:
        """One scheduler iteration of `dt_s` simulated seconds ran."""
        self.counters["steps_total"] += 1
        self._window[1] += dt_s

    def count_finished(self, req: SchedReq) -> None:
        """Totals SGLang's tokenizer-side metrics count when a request ends."""
        self.counters["prompt_tokens_total"] += req.prompt_len
        self.counters["generation_tokens_total"] += req.generated
        self.counters["cached_tokens_total"] += req.cached

    def count_decode(self, tokens: int) -> None:
        """SGLang recomputes gen_throughput every decode_log_interval decode iterations
        over the wall time since the last one (prefill iterations included)."""
        self._window[0] += tokens
        self.counters["decode_tokens_total"] += tokens
        self._window[2] += 1
        if self._window[2] >= DECODE_LOG_INTERVAL:
            tokens_w, seconds_w, _ = self._window
            self.last_gen_throughput = tokens_w / seconds_w if seconds_w > 0 else 0.0
            self._window = [0, 0.0, 0]
            self.log_stats()


def build_loads(
    pool: KVPool, stats: EngineStats, num_running: int, waiting: Collection[SchedReq], max_running_requests: int
) -> dict:
    """One dp rank's entry of SGLang's `/v1/loads`."""
    size = pool.max_total_num_tokens
    num_used = pool.used_tokens - pool.radix.evictable_size
    waiting_tokens = sum(r.prompt_len + r.generated for r in waiting)
    hit, computed = stats.counters["cached_prefill_tokens_total"], stats.counters["computed_prefill_tokens_total"]
    return {
        "dp_rank": 0,
        "num_running_reqs": num_running,
        "num_waiting_reqs": len(waiting),
        "num_waiting_uncached_tokens": waiting_tokens,  # upper bound: cache not consulted
        "num_used_tokens": num_used,
        "num_total_tokens": num_used + waiting_tokens,
        "num_active_tokens": num_used + waiting_tokens,  # = num_total_tokens outside PD disaggregation
        "max_total_num_tokens": size,
        "max_running_requests": max_running_requests,
        "token_usage": round(num_used / size, 4),
        "gen_throughput": round(stats.last_gen_throughput, 2),
        "cache_hit_rate": round(hit / (hit + computed), 4) if hit + computed else 0.0,
        "utilization": round(num_used / size, 4),
        "total_prefill_uncached_tokens": computed,
        "total_prefill_busy_us": stats.counters["prefill_busy_us_total"],
        "decode_moments": None,  # SGLang: None until its decode step-time sums are recorded
        "queues": {
            "waiting": len(waiting),
            "grammar": 0,
            "paused": 0,
            "retracted": stats.num_retracted_reqs,
            "prealloc_ready": 0,
        },
    }
