"""/metrics in Prometheus text with SGLang 0.5.17's names (python/sglang/srt/observability/
metrics_collector.py): scheduler gauges labelled like SGLang's SchedulerMetricsCollector
(model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; no dp_rank, as SGLang at dp_size 1) and
the tokenizer-side counters (labelled
model_name). Values are read from the engine at scrape time through an own CollectorRegistry.
tests/contract checks these names against the installed SGLang."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# (metric name, field of engine.loads(), help) -- gauges, one sample per dp rank.
_GAUGES = (
    ("sglang:num_running_reqs", "num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "num_waiting_reqs", "The number of requests in the waiting queue."),
    ("sglang:num_used_tokens", "num_used_tokens", "The number of used tokens."),
    ("sglang:token_usage", "token_usage", "The token usage."),
    ("sglang:gen_throughput", "gen_throughput", "The generation throughput (token/s)."),
    ("sglang:cache_hit_rate", "cache_hit_rate", "The prefix cache hit rate."),
    ("sglang:max_total_num_tokens", "max_total_num_tokens", "Maximum total number of tokens in the KV pool."),
    ("sglang:kv_used_tokens", "num_used_tokens", "Actively used KV slots (locked by running requests)."),
    ("sglang:utilization", "utilization", "The utilization."),
    ("sglang:new_token_ratio", "new_token_ratio", "The new token ratio."),
    ("sglang:num_paused_reqs", "num_paused_reqs", "The number of paused requests by async weight sync."),
    # Requests taken back by the latest retraction since the previous stats log (reset at each).
    ("sglang:num_retracted_reqs", "num_retracted_reqs", "The number of retracted requests."),
    ("sglang:is_cuda_graph", "is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("sglang:spec_accept_length", "spec_accept_length", "Mean acceptance length of speculative decoding "
     "(accepted drafts + bonus token per forward)."),
    ("sglang:spec_accept_rate", "spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed "
     "drafts` in batch)."),
)
# Scheduler-side counters: labelled, so SGLang serves no sample before the first increment.
_RANK_COUNTERS = (
    ("sglang:num_retracted_requests", "num_retracted_requests_total", "Total number of retracted requests."),
)
# (metric name without _total, field of engine.counters(), help, extra label) -- tokenizer-side,
# labelled model_name plus SGLang's split label; the sim does not split, so all counts go under
# is_streaming="false" / cache_source="device" (the totals are right, the split is not modelled).
_COUNTERS = (
    ("sglang:prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed.", ("is_streaming", "false")),
    ("sglang:generation_tokens", "generation_tokens_total", "Number of generation tokens processed.",
     ("is_streaming", "false")),
    ("sglang:cached_tokens", "cached_tokens_total", "Number of cached prompt tokens by source (device/host/storage).",
     ("cache_source", "device")),
    ("sglang:num_requests", "num_requests_total", "Number of requests processed.", ("is_streaming", "false")),
)


class SimCollector:
    """Collects on scrape; `snapshot()` returns (per-rank loads list, counters dict)."""

    def __init__(self, model_name: str, snapshot: Callable[[], tuple[list[dict[str, Any]], dict[str, Any]]]):
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        loads, counters = self.snapshot()
        rank_labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]

        def rank_values(load: dict[str, Any]) -> list[str]:
            return [self.model_name, "unified", "0", "0", "0"]

        for name, key, doc in _GAUGES:
            g = GaugeMetricFamily(name, doc, labels=rank_labels)
            for load in loads:
                g.add_metric(rank_values(load), float(load.get(key) or 0.0))
            yield g
        for name, key, doc in _RANK_COUNTERS:
            if counters.get(key, 0) > 0:  # the sim is one rank; its counters are that rank's
                c = CounterMetricFamily(name, doc, labels=rank_labels)
                c.add_metric(rank_values(loads[0]), float(counters[key]))
                yield c
        passes = CounterMetricFamily("sglang:cuda_graph_passes", "Total number of forward passes categorized by "
                                     "CUDA graph.", labels=[*rank_labels, "mode"])
        for mode in ("decode_cuda_graph", "decode_none"):  # SGLang: a sample once a pass of that mode ran
            if counters.get(f"{mode}_passes_total", 0) > 0:
                passes.add_metric([*rank_values(loads[0]), mode], float(counters[f"{mode}_passes_total"]))
        yield passes
        for name, key, doc, (label, value) in _COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["model_name", label])
            c.add_metric([self.model_name, value], float(counters.get(key, 0)))
            yield c


def make_registry(collector: SimCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text exposition (version 0.0.4) of `registry`."""
    return generate_latest(registry)
