"""Live load: running/queued requests, KV tokens in use, retractions, summed over DP ranks and servers.

`/v1/loads` (SGLang, no flag needed; python/sglang/srt/entrypoints/v1_loads.py) gives the gauges;
`/metrics` (SGLang with --enable-metrics, or vLLM) gives them too plus the cumulative counters
(`sglang:num_retracted_requests_total`, per python/sglang/srt/metrics/collector.py). SGLang names
appear as `sglang:x` and `sglang_x`; both are read. Which sources a URL has is remembered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from ..records import LoadSnapshot
from .capacity import _families, get_json, get_text

# Our field ← metric names (SGLang first, then vLLM).
_GAUGES = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "used_tokens": ("sglang:num_used_tokens",),
    "total_tokens": ("sglang:max_total_num_tokens",),
    "token_usage": ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "gen_throughput": ("sglang:gen_throughput",),
    "retractions_total": ("sglang:num_retracted_requests_total", "vllm:num_preemptions_total"),
    "gen_tokens_total": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
}


@dataclass
class _Sources:
    loads: bool | None = None  # None = not tried yet
    metrics: bool | None = None


_KNOWN: dict[str, _Sources] = {}  # per base URL, for the life of the process


def load_from_loads(body: Any, now_s: float) -> LoadSnapshot | None:
    """One server's load from /v1/loads JSON (sum over dp ranks)."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads or not all(isinstance(ld, dict) for ld in loads):
        return None
    def total(key: str) -> Any:
        vals = [ld.get(key) for ld in loads]
        return sum(vals) if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals) else None
    running, queued = total("num_running_reqs"), total("num_waiting_reqs")
    if running is None or queued is None:
        return None
    used, cap = total("num_used_tokens"), total("max_total_num_tokens")
    usage = used / cap if used is not None and cap else _mean([ld.get("token_usage") for ld in loads])
    return LoadSnapshot(t_s=now_s, running=int(running), queued=int(queued),
                        used_tokens=None if used is None else int(used), token_usage=usage,
                        gen_throughput=total("gen_throughput"))


def load_from_metrics(text: str, now_s: float) -> LoadSnapshot | None:
    """One server's load from Prometheus text; None without running/queued gauges."""
    values = metric_values(text)
    def pick(field: str) -> float | None:
        for name in _GAUGES[field]:
            if name in values:
                return sum(values[name].values())
        return None
    running, queued = pick("running"), pick("queued")
    if running is None or queued is None:
        return None
    used, cap = pick("used_tokens"), pick("total_tokens")
    usage = used / cap if used is not None and cap else _mean_of(values, _GAUGES["token_usage"])
    retr, gen = pick("retractions_total"), pick("gen_tokens_total")
    return LoadSnapshot(t_s=now_s, running=int(running), queued=int(queued),
                        used_tokens=None if used is None else int(used), token_usage=usage,
                        retractions_total=None if retr is None else int(retr),
                        gen_tokens_total=None if gen is None else int(gen), gen_throughput=pick("gen_throughput"))


def metric_values(text: str) -> dict[str, dict[str, float]]:
    """sample name (sglang_ → sglang:) → {dp rank or engine: value}; one value per rank (the max)."""
    out: dict[str, dict[str, float]] = {}
    for family in _families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            name = "sglang:" + s.name[len("sglang_"):] if s.name.startswith("sglang_") else s.name
            rank = s.labels.get("dp_rank", s.labels.get("engine", ""))
            per_rank = out.setdefault(name, {})
            per_rank[rank] = max(per_rank.get(rank, s.value), s.value)  # tp ranks repeat a rank's value
    return out


def merge(snaps: list[LoadSnapshot]) -> LoadSnapshot:
    """Several servers (or loads + metrics of one) → one snapshot; a field is None if any is None."""
    def total(field: str) -> Any:
        vals = [getattr(s, field) for s in snaps]
        return None if any(v is None for v in vals) else sum(vals)
    used = total("used_tokens")
    usages = [s.token_usage for s in snaps]
    return LoadSnapshot(t_s=snaps[0].t_s, running=sum(s.running for s in snaps),
                        queued=sum(s.queued for s in snaps), used_tokens=used,
                        token_usage=_mean(usages), retractions_total=total("retractions_total"),
                        gen_tokens_total=total("gen_tokens_total"), gen_throughput=total("gen_throughput"))


async def read_load(http: aiohttp.ClientSession, urls: list[str], now_s: float) -> LoadSnapshot | None:
    """Load summed over `urls`; None when no server exposes /v1/loads or /metrics (or any is down)."""
    snaps = [await _load_of(http, url, now_s) for url in urls]
    if not snaps or any(s is None for s in snaps):
        return None
    return merge([s for s in snaps if s is not None])


async def _load_of(http: aiohttp.ClientSession, url: str, now_s: float) -> LoadSnapshot | None:
    known = _KNOWN.setdefault(url, _Sources())
    from_loads = from_metrics = None
    if known.loads is not False:
        from_loads = load_from_loads(await get_json(http, url + "/v1/loads"), now_s)
    if known.metrics is not False:
        text = await get_text(http, url + "/metrics")
        from_metrics = load_from_metrics(text, now_s) if text else None
    # A source is written off only when the other one answered in the same poll (the server was up).
    if from_loads or from_metrics:
        known.loads = from_loads is not None if known.loads is None else known.loads
        known.metrics = from_metrics is not None if known.metrics is None else known.metrics
    if from_loads and from_metrics:  # gauges from /v1/loads, cumulative counters from /metrics
        return replace(from_loads, retractions_total=from_metrics.retractions_total,
                       gen_tokens_total=from_metrics.gen_tokens_total)
    return from_loads or from_metrics


def _mean(vals: list[Any]) -> float | None:
    nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(nums) / len(nums) if nums and len(nums) == len(vals) else None


def _mean_of(values: dict[str, dict[str, float]], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return _mean(list(values[name].values()))
    return None
