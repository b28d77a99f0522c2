"""Hardware profiles for the simulator: a step-time model and the KV pool size.

"seed" is calibrated (bench/calibrate.py) against the seed run in DESIGN.md:
Kimi-K2.5-like on one 8-GPU node, whose server reported 116K KV tokens at
mem_fraction_static 0.85 (bf16), 159K at 0.88 (bf16) and 376K at 0.90
(fp8_e4m3). "fast" is a small pool with quick steps for tests.

Step time = base + per-request + per-KV-token + per-prefill-token terms:
weights are read once per step (base), MoE expert/sampling work grows with the
batch (per request), attention reads every KV token of the batch (per KV
token, halved for fp8 KV since it reads half the bytes), and prefill is
compute-bound (per prefill token).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

__all__ = [
    "NO_GRAPH_STEP_FACTOR",
    "HardwareProfile",
    "KV_DTYPE_BYTES_FACTOR",
    "default_cuda_graph_max_bs",
    "PROFILES",
    "get_profile",
    "hicache_capacity_tokens",
    "kv_capacity_tokens",
]

# KV bytes per token relative to bf16, keyed by SGLang's --kv-cache-dtype choices
# (python/sglang/srt/server_args.py); "auto" is the model dtype, bf16 here.
KV_DTYPE_BYTES_FACTOR: dict[str, float] = {
    "auto": 1.0,
    "bf16": 1.0,
    "bfloat16": 1.0,
    "fp8_e4m3": 0.5,
    "fp8_e5m2": 0.5,
}

# A decode step SGLang runs without a CUDA graph (batch above cuda_graph_max_bs) against one that
# replays a graph, at the same batch: issue 34 measured 15.4K tok/s at 224-255 running with graphs and
# 7.5-8.5K at 256-320 without on one H100 (1.2B Llama, SGLang 0.5.17): ~1.8-2x the step time.
NO_GRAPH_STEP_FACTOR = 1.9


def default_cuda_graph_max_bs(gpu_mem_gb: float, tp_size: int) -> int:
    """SGLang 0.5.17's default decode CUDA-graph ceiling (server_args.py, _handle_gpu_memory_settings:
    `cuda_graph_config.decode.max_bs` by GPU memory and TP size, when no --cuda-graph-max-bs is given)."""
    mib = gpu_mem_gb * 1024
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 24 if tp_size < 4 else 80
    if mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if mib < 160 * 1024:  # H100 / A100 80GB, H20 / H200
        return 256 if tp_size < 4 else 512
    return 512  # B200, MI300


@dataclass(frozen=True)
class HardwareProfile:
    """Step-time coefficients (seconds) and KV sizing for one simulated machine."""

    name: str
    step_base_s: float
    decode_per_req_s: float
    decode_per_kv_token_s: float  # for bf16 KV; see with_kv_dtype()
    prefill_per_token_s: float
    hicache_load_per_token_s: float  # host -> GPU copy of one cached token
    kv_bytes_per_token: int  # bf16, per GPU; sizes the hicache host tier
    # (mem_fraction_static, bf16 KV tokens) points the pool is interpolated from.
    pool_points: tuple[tuple[float, int], ...] = ()
    fixed_pool_tokens: int = 0  # when > 0 the pool ignores mem fraction and dtype
    gpu_mem_gb: float = 141.0  # per GPU: SGLang's default cuda_graph_max_bs follows it
    no_graph_step_factor: float = NO_GRAPH_STEP_FACTOR  # step time x this above the graph ceiling

    def step_time_s(self, batch_size: int, kv_tokens: int, prefill_tokens: int, graph: bool = True) -> float:
        """Simulated seconds of one forward pass (one token per request for decode); `graph` False: a
        decode step run eagerly (its batch is above the CUDA-graph ceiling), no_graph_step_factor x slower."""
        t = (
            self.step_base_s
            + self.decode_per_req_s * batch_size
            + self.decode_per_kv_token_s * kv_tokens
            + self.prefill_per_token_s * prefill_tokens
        )
        return t if graph else t * self.no_graph_step_factor

    def with_kv_dtype(self, kv_cache_dtype: str) -> HardwareProfile:
        """The same machine with attention cost scaled to the KV dtype's bytes.

        Raises ValueError for a dtype SGLang would not accept here."""
        factor = _dtype_factor(kv_cache_dtype)
        return replace(self, decode_per_kv_token_s=self.decode_per_kv_token_s * factor)


PROFILES: dict[str, HardwareProfile] = {
    # Coefficients fitted by bench/calibrate.py so a fixed concurrency of 150 with
    # B2-like requests lands inside the seed table for all three configurations.
    "seed": HardwareProfile(
        name="seed",
        step_base_s=0.025,
        decode_per_req_s=0.00030,
        decode_per_kv_token_s=1.7e-7,
        prefill_per_token_s=7.0e-5,
        hicache_load_per_token_s=3.0e-6,
        # The seed's slope: 1.433M tokens per unit of mem fraction on 141 GB GPUs.
        kv_bytes_per_token=98_400,
        pool_points=((0.85, 116_000), (0.88, 159_000), (0.90, 188_000)),
    ),
    # One H200 serving a random-weight 1.2B Llama (hidden 2048, 24 layers, 4 KV heads: 49,152 B of
    # bf16 KV per token) with SGLang 0.5.17, triton attention, 60,000 KV tokens: fitted by
    # bench/sim_vs_real.py to the fixed-window sweep measured there (bench/gpu/h200_results.json).
    "h200": HardwareProfile(
        name="h200",
        # Non-negative least squares over the fixed-window sweep (mean of both H200 runs; prefill and
        # KV terms came out 0: their cost is inside the per-step figure). 1.74 ms + 44.9 us x 127
        # running = 7.4 ms a step, the server's own decode log said 7.6 ms at 127 running.
        step_base_s=0.00174,
        decode_per_req_s=4.49e-5,
        decode_per_kv_token_s=0.0,
        prefill_per_token_s=0.0,
        hicache_load_per_token_s=2.0e-8,
        kv_bytes_per_token=49_152,
        # (141 GB x fraction - 2.4 GB weights - ~4 GB graphs and activations) / 49,152 B
        pool_points=((0.40, 1_020_000), (0.85, 2_310_000)),
    ),
    "fast": HardwareProfile(
        name="fast",
        step_base_s=0.002,
        decode_per_req_s=2.0e-5,
        decode_per_kv_token_s=1.0e-8,
        prefill_per_token_s=2.0e-6,
        hicache_load_per_token_s=1.0e-7,
        kv_bytes_per_token=65_536,
        fixed_pool_tokens=24_576,
    ),
}


def get_profile(name: str, kv_cache_dtype: str = "auto") -> HardwareProfile:
    """PROFILES[name] adjusted to the KV dtype. Raises ValueError for an unknown name."""
    if name not in PROFILES:
        raise ValueError(f"unknown hardware profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name].with_kv_dtype(kv_cache_dtype)


def kv_capacity_tokens(profile_name: str, mem_fraction_static: float, kv_cache_dtype: str) -> int:
    """GPU KV pool size in tokens (SGLang's max_total_num_tokens) for these server flags.

    Piecewise-linear through the seed's measured points; fp8 KV holds 2x the tokens.
    hicache adds none (it only keeps evicted prefixes in host RAM). Raises ValueError."""
    profile = get_profile(profile_name, kv_cache_dtype)
    if profile.fixed_pool_tokens:
        return profile.fixed_pool_tokens
    if not 0.0 < mem_fraction_static < 1.0:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    bf16_tokens = _interpolate(profile.pool_points, mem_fraction_static)
    if bf16_tokens <= 0:
        raise ValueError(
            f"mem_fraction_static={mem_fraction_static} leaves no room for the KV cache "
            f"on profile {profile_name!r} (weights do not fit); raise it"
        )
    return round(bf16_tokens / _dtype_factor(kv_cache_dtype))


def hicache_capacity_tokens(profile_name: str, hicache_size_gb: float, kv_cache_dtype: str) -> int:
    """Host-tier tokens that `--hicache-size` GB hold (per GPU, like SGLang's flag)."""
    profile = get_profile(profile_name, kv_cache_dtype)
    bytes_per_token = profile.kv_bytes_per_token * _dtype_factor(kv_cache_dtype)
    return int(hicache_size_gb * 1e9 / bytes_per_token)


def _dtype_factor(kv_cache_dtype: str) -> float:
    try:
        return KV_DTYPE_BYTES_FACTOR[kv_cache_dtype]
    except KeyError:
        raise ValueError(
            f"unsupported kv_cache_dtype {kv_cache_dtype!r}; choose one of {sorted(KV_DTYPE_BYTES_FACTOR)}"
        ) from None


def _interpolate(points: tuple[tuple[float, int], ...], x: float) -> float:
    """Piecewise-linear through `points`, extended with the end segments' slopes."""
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(points) - 2)
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    return y0 + (x - x0) * (y1 - y0) / (x1 - x0)
