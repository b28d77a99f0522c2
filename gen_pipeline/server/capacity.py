"""What a server can hold (KV tokens, decode slots) from its HTTP API, best first (SGLang's http_server.py,
v1_loads.py): `/server_info` (old `/get_server_info`), `/v1/loads`, vLLM's `/metrics`. Every DP rank has its own
pool; the scheduler admits against the pool × dcp_size (scheduler.py: a DCP rank holds 1/d of every token)."""

from __future__ import annotations

import contextlib
import re
from typing import Any, TypeGuard

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gen_pipeline.http import Http, HttpError
from gen_pipeline.records import Capacity

INFO_KEYS = ("model_path", "served_model_name", "tp_size", "dp_size", "kv_cache_dtype", "mem_fraction_static",
             "enable_hierarchical_cache", "hicache_size", "num_continuous_decode_steps", "context_length",
             "max_running_requests", "reasoning_parser", "enable_metrics", "version", "dcp_size",
             "speculative_algorithm", "speculative_num_draft_tokens",  # a draft runs: run/connect.py
             "max_total_num_tokens")  # one rank's pool, checked against the start-up log: server/supervisor.py
_LOG_CAPACITY = re.compile(r"max_total_num_tokens=(\d+)(?:.*?max_running_requests=(\d+))?")
PROBE_TIMEOUT_S = 10.0


def capacity_from_server_info(info: dict[str, Any]) -> Capacity | None:
    """Capacity of one server from its /server_info JSON; None if it has no max_total_num_tokens."""
    tokens = info.get("max_total_num_tokens")
    if not _is_int(tokens) or tokens <= 0:
        return None
    states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
    ranks = len(states) or (info.get("dp_size") if _is_int(info.get("dp_size")) else 1) or 1
    per_dp = _positive_ints([s.get("effective_max_running_requests_per_dp") for s in states])
    max_running = info.get("max_running_requests")  # the CLI value; null when SGLang chose it
    if states and per_dp is not None:
        max_running = sum(per_dp)
    elif not _is_int(max_running):
        max_running = None
    dcp = info["dcp_size"] if _is_int(info.get("dcp_size")) and info["dcp_size"] > 1 else 1
    graphs = cuda_graph_max_bs(info)
    return Capacity(tokens * ranks * dcp, max_running, servers=1, source="server_info",
                    cuda_graph_max_bs=None if graphs is None else graphs * ranks)


def cuda_graph_max_bs(info: dict[str, Any]) -> int | None:
    """One DP rank's decode CUDA-graph ceiling from /server_info, None when absent or graphs are off
    (then no batch size is faster than its neighbours for want of a graph)."""
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    if isinstance(decode, dict):  # SGLang 0.5.17: server_args.cuda_graph_config (resolved)
        if decode.get("backend") == "disabled":
            return None
        value = decode.get("max_bs")
    elif info.get("disable_cuda_graph") is True:
        return None
    else:  # older SGLang: a flat server arg
        value = info.get("cuda_graph_max_bs")
    return value if _is_int(value) and value > 0 else None


def capacity_from_loads(body: Any) -> Capacity | None:
    """Capacity from /v1/loads JSON ({"loads": [per dp rank]}); None if absent."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    tokens = _positive_ints([ld.get("max_total_num_tokens") for ld in loads if isinstance(ld, dict)])
    if not tokens:
        return None
    running = _positive_ints([ld.get("max_running_requests") for ld in loads])
    return Capacity(sum(tokens), None if running is None else sum(running), servers=1, source="loads")


def capacity_from_vllm_metrics(text: str) -> Capacity | None:
    """vLLM: num_gpu_blocks × block_size from the vllm:cache_config_info info-gauge labels."""
    total = 0
    for sample in (s for family in metric_families(text) for s in family.samples):
        if sample.name.startswith("vllm:cache_config_info"):
            with contextlib.suppress(KeyError, ValueError):
                total += int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
    return Capacity(total, None, servers=1, source="vllm_metrics") if total > 0 else None


def capacity_from_log(lines: list[str]) -> tuple[int, int | None] | None:
    """(max_total_num_tokens, max_running_requests) from SGLang's start-up line (scheduler.py), last one."""
    m = next((found for line in reversed(lines) if (found := _LOG_CAPACITY.search(line))), None)
    return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else None


def combine(caps: list[Capacity | None]) -> Capacity:
    """Sum over servers; any server of unknown capacity makes the total unknown."""
    if not caps or any(c is None for c in caps):
        return Capacity(0, None, servers=len(caps), source="unknown")
    known = [c for c in caps if c is not None]
    running = [c.max_running_requests for c in known]
    graphs = [c.cuda_graph_max_bs for c in known]
    sources = sorted({c.source for c in known})
    return Capacity(sum(c.max_total_num_tokens for c in known),
                    None if any(r is None for r in running) else sum(r for r in running if r is not None),
                    servers=len(known), source="+".join(sources),
                    cuda_graph_max_bs=None if any(g is None for g in graphs) else sum(g for g in graphs if g))


async def probe(http: Http, url: str) -> tuple[Capacity | None, dict[str, Any]]:
    """One server's capacity and its server_info summary ({} when it has none)."""
    for path in ("/server_info", "/get_server_info"):
        body = await get_or_none(http, url + path)
        if isinstance(body, dict):
            cap = capacity_from_server_info(body)
            if cap is not None:
                return cap, {**{k: body[k] for k in INFO_KEYS if k in body}, "backend": "sglang"}
    cap = capacity_from_loads(await get_or_none(http, url + "/v1/loads"))
    if cap is not None:
        return cap, {"backend": "sglang"}
    text = await get_or_none(http, url + "/metrics", text=True)
    cap = capacity_from_vllm_metrics(text) if text else None
    return cap, {"backend": "vllm" if cap is not None else "openai"}


async def get_or_none(http: Http, url: str, *, text: bool = False) -> Any:
    """GET → parsed JSON (`text`: the text) of a 200 answer, or None on any failure (no answer, non-200, not
    JSON): "nothing there" is an answer."""
    try:
        return await (http.get_text if text else http.get_json)(url, timeout_s=PROBE_TIMEOUT_S)
    except HttpError:
        return None


def metric_families(text: str) -> list[Metric]:
    """A Prometheus /metrics text's metric families; [] when it does not parse."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        return []


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_ints(values: list[Any]) -> list[int] | None:
    """`values` if every one is an int > 0 (an empty list included), else None."""
    return values if all(_is_int(v) and v > 0 for v in values) else None
