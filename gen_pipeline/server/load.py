"""Live load (running, queued, KV in use, retractions) summed over DP ranks and servers: gauges from `/v1/loads`,
also counters from `/metrics`. Retractions (srt/metrics/collector.py): 0.4.7-0.4.10 the cumulative gauge
`sglang:total_retracted_reqs`; 0.5.x the gauge `sglang:num_retracted_reqs` (the latest retraction's size: tallied
here); 0.5.17 also the counter `sglang:num_retracted_requests_total`, absent until the first; vLLM preemptions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gen_pipeline.http import Http
from gen_pipeline.records import LoadSnapshot
from gen_pipeline.server.capacity import get_or_none, metric_families

# Our field ← metric names (SGLang first, then vLLM).
_GAUGES = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "used_tokens": ("sglang:num_used_tokens",),
    "total_tokens": ("sglang:max_total_num_tokens",),
    "token_usage": ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "gen_throughput": ("sglang:gen_throughput",),
    "retractions_total": ("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs",
                          "vllm:num_preemptions_total"),
    "retracted_recent": ("sglang:num_retracted_reqs",),  # per stats-log window, reset each log
    "gen_tokens_total": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    # a draft's tokens per verify step over the scheduler's last decode log interval (0 without a draft)
    "spec_accept_length": ("sglang:spec_accept_length",),
}
# Also read: sglang:new_token_ratio, the admission estimate of the last prefill round (the
# controller's warm-up signal, gen_pipeline/controller/feed.py); the highest over ranks.


class RetractionTally:
    """Cumulative retractions from the per-window gauge `sglang:num_retracted_reqs`: a positive reading that
    differs from the rank's previous one is new (two equal ones in consecutive polls count once: low, never high)."""

    def __init__(self) -> None:
        self.total = 0
        self._last: dict[str, float] = {}

    def update(self, per_rank: dict[str, float]) -> int:
        for rank, value in per_rank.items():
            if value > 0 and value != self._last.get(rank):
                self.total += int(value)
            self._last[rank] = value
        return self.total


# Read for older servers only (0.4.7 .. 0.4.10); tests/contract checks the rest against 0.5.17.
OLDER_SGLANG_NAMES = frozenset({"sglang:total_retracted_reqs"})


@dataclass
class _Sources:
    loads: bool | None = None  # None = not tried yet
    metrics: bool | None = None
    tally: RetractionTally = field(default_factory=RetractionTally)


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


def load_from_metrics(text: str, now_s: float, tally: RetractionTally | None = None) -> LoadSnapshot | None:
    """One server's load from Prometheus text; None without running/queued gauges.
    `tally` carries the retraction gauge's readings from poll to poll (one URL's)."""
    values = metric_values(text)
    def pick(field: str, of: Callable[[list[float]], float | None] = sum) -> float | None:
        return next((of(list(values[name].values())) for name in _GAUGES[field] if name in values), None)
    running, queued = pick("running"), pick("queued")
    if running is None or queued is None:
        return None
    used, cap = pick("used_tokens"), pick("total_tokens")
    usage = used / cap if used is not None and cap else pick("token_usage", _mean)
    retr, gen = _retractions(values, pick("retractions_total"), tally or RetractionTally()), pick("gen_tokens_total")
    ratios = values.get("sglang:new_token_ratio")
    return LoadSnapshot(t_s=now_s, running=int(running), queued=int(queued),
                        used_tokens=None if used is None else int(used), token_usage=usage,
                        retractions_total=None if retr is None else int(retr),
                        gen_tokens_total=None if gen is None else int(gen), gen_throughput=pick("gen_throughput"),
                        new_token_ratio=max(ratios.values()) if ratios else None,
                        spec_accept_length=pick("spec_accept_length", _mean) or None)


def _retractions(values: dict[str, dict[str, float]], counted: float | None,
                 tally: RetractionTally) -> float | None:
    """The cumulative count where served, else the gauge's tally; the larger of the two, so a
    0.5.17 server's counter appearing at its first retraction takes over without a jump back."""
    recent = next((values[n] for n in _GAUGES["retracted_recent"] if n in values), None)
    tallied = tally.update(recent) if recent is not None else None
    if counted is None:
        return tallied
    return counted if tallied is None else max(counted, tallied)


def metric_values(text: str) -> dict[str, dict[str, float]]:
    """sample name (sglang_ → sglang:) → {dp rank or engine: value}. Within a rank, samples that
    differ only in tp_rank repeat one value (the max is kept); other labels (SGLang 0.5.17's
    is_streaming, cache_source) split a total, so those are added up."""
    per_series: dict[str, dict[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    for family in metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            name = "sglang:" + s.name[len("sglang_"):] if s.name.startswith("sglang_") else s.name
            rank = s.labels.get("dp_rank", s.labels.get("engine", ""))
            series = tuple(sorted((k, v) for k, v in s.labels.items() if k != "tp_rank"))
            by_series = per_series.setdefault(name, {}).setdefault(rank, {})
            by_series[series] = max(by_series.get(series, s.value), s.value)
    return {name: {rank: sum(series.values()) for rank, series in ranks.items()}
            for name, ranks in per_series.items()}


def merge(snaps: list[LoadSnapshot]) -> LoadSnapshot:
    """Several servers (or loads + metrics of one) → one snapshot; a field is None if any is None."""
    def total(field: str) -> Any:
        vals = [getattr(s, field) for s in snaps]
        return None if any(v is None for v in vals) else sum(vals)
    return LoadSnapshot(t_s=snaps[0].t_s, running=sum(s.running for s in snaps),
                        queued=sum(s.queued for s in snaps), used_tokens=total("used_tokens"),
                        token_usage=_mean([s.token_usage for s in snaps]), retractions_total=total("retractions_total"),
                        gen_tokens_total=total("gen_tokens_total"), gen_throughput=total("gen_throughput"),
                        new_token_ratio=max((r for s in snaps if (r := s.new_token_ratio) is not None), default=None),
                        spec_accept_length=_mean([s.spec_accept_length for s in snaps]))


async def read_load(http: Http, urls: list[str], now_s: float) -> LoadSnapshot | None:
    """Load summed over `urls`; None when no server exposes /v1/loads or /metrics (or any is down)."""
    snaps = [await _load_of(http, url, now_s) for url in urls]
    if not snaps or any(s is None for s in snaps):
        return None
    return merge([s for s in snaps if s is not None])


async def _load_of(http: Http, url: str, now_s: float) -> LoadSnapshot | None:
    known = _KNOWN.setdefault(url, _Sources())
    from_loads = from_metrics = None
    if known.loads is not False:
        from_loads = load_from_loads(await get_or_none(http, url + "/v1/loads"), now_s)
    if known.metrics is not False:
        text = await get_or_none(http, url + "/metrics", text=True)
        from_metrics = load_from_metrics(text, now_s, known.tally) if text else None
    # A source is written off only when the other one answered in the same poll (the server was up).
    if from_loads or from_metrics:
        known.loads = from_loads is not None if known.loads is None else known.loads
        known.metrics = from_metrics is not None if known.metrics is None else known.metrics
    if from_loads and from_metrics:  # gauges from /v1/loads, cumulative counters from /metrics
        return replace(from_loads, retractions_total=from_metrics.retractions_total,
                       gen_tokens_total=from_metrics.gen_tokens_total, new_token_ratio=from_metrics.new_token_ratio,
                       spec_accept_length=from_metrics.spec_accept_length)
    return from_loads or from_metrics


def _mean(vals: list[Any]) -> float | None:
    nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(nums) / len(nums) if nums and len(nums) == len(vals) else None
