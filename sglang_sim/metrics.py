"""/metrics in Prometheus text with SGLang's names (python/sglang/srt/metrics/collector.py):
scheduler gauges labelled like SGLang's SchedulerMetricsCollector (model_name, engine_type,
tp_rank, pp_rank, dp_rank) and the tokenizer-side counters (labelled model_name).
Values are read from the engine at scrape time through an own CollectorRegistry."""

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
)
# (metric name without _total, field of engine.counters(), help, scheduler-labelled?)
_COUNTERS = (
    ("sglang:num_retracted_requests", "num_retracted_requests_total", "Total number of retracted requests.", True),
    ("sglang:prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed.", False),
    ("sglang:generation_tokens", "generation_tokens_total", "Number of generation tokens processed.", False),
    ("sglang:cached_tokens", "cached_tokens_total", "Number of cached prompt tokens.", False),
    ("sglang:num_requests", "num_requests_total", "Number of requests processed.", False),
)


class SimCollector:
    """Collects on scrape; `snapshot()` returns (per-rank loads list, counters dict)."""

    def __init__(self, model_name: str, snapshot: Callable[[], tuple[list[dict[str, Any]], dict[str, Any]]]):
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        loads, counters = self.snapshot()
        rank_labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]

        def rank_values(load: dict[str, Any]) -> list[str]:
            return [self.model_name, "unified", "0", "0", str(load.get("dp_rank", 0))]

        for name, key, doc in _GAUGES:
            g = GaugeMetricFamily(name, doc, labels=rank_labels)
            for load in loads:
                g.add_metric(rank_values(load), float(load.get(key) or 0.0))
            yield g
        retracted_now = GaugeMetricFamily("sglang:num_retracted_reqs", "The number of retracted requests.",
                                          labels=rank_labels)
        for load in loads:
            retracted_now.add_metric(rank_values(load), float(load.get("queues", {}).get("retracted", 0)))
        yield retracted_now
        for name, key, doc, per_rank in _COUNTERS:
            c = CounterMetricFamily(name, doc, labels=rank_labels if per_rank else ["model_name"])
            value = float(counters.get(key, 0))
            c.add_metric(rank_values(loads[0]) if per_rank else [self.model_name], value)
            yield c


def make_registry(collector: SimCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text exposition (version 0.0.4) of `registry`."""
    return generate_latest(registry)
