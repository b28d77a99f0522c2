"""The controller benchmark's jobs and servers: seeded length profiles, the seed's server configs,
the LoadSnapshot the pipeline's poller builds from the engine's /v1/loads fields and counters, and
the figures of one run. bench/engine_run.py drives the production dispatcher over them.

Length profiles (lognormal, median and log-space sigma; outputs capped at max_new_tokens,
which then finish with "length"):
    B1  ShareGPT-like chat        prompt ~300, output ~600
    B2  long reasoning            prompt ~800, output ~3,600 (4K+ per sample)
    B6  UltraChat-like            prompt ~350, output ~750 (~1.1K per sample)
    B7  Magpie-like               prompt ~100, output ~600 (~700 per sample)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gen_pipeline.records import LoadSnapshot
from sglang_sim.engine import Engine, EngineConfig
from sglang_sim.profiles import get_profile, hicache_capacity_tokens, kv_capacity_tokens

POLL_S = 1.0  # the pipeline polls /v1/loads about once a second


@dataclass(frozen=True)
class LengthProfile:
    name: str
    description: str
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    max_new_tokens: int

    def mean(self, median: float, sigma: float) -> float:
        return median * math.exp(sigma**2 / 2)


LENGTH_PROFILES = {
    "B1": LengthProfile("B1", "ShareGPT-like chat", 220, 0.8, 480, 0.7, 2048),
    "B2": LengthProfile("B2", "long reasoning, 4K+", 700, 0.5, 3200, 0.5, 8192),
    "B6": LengthProfile("B6", "UltraChat-like ~1.1K", 280, 0.7, 660, 0.5, 2048),
    "B7": LengthProfile("B7", "Magpie-like ~700", 90, 0.5, 530, 0.5, 2048),
}


@dataclass(frozen=True)
class ServerConfig:
    """One row of the seed's table (DESIGN.md): KV pool from the seed profile."""

    label: str
    mem_fraction_static: float
    kv_cache_dtype: str
    hicache_size_gb: float

    def engine(self) -> Engine:
        pool = kv_capacity_tokens("seed", self.mem_fraction_static, self.kv_cache_dtype)
        host = hicache_capacity_tokens("seed", self.hicache_size_gb, self.kv_cache_dtype) if self.hicache_size_gb else 0
        cfg = EngineConfig(max_total_num_tokens=pool, num_continuous_decode_steps=4, hicache_tokens=host)
        return Engine(cfg, get_profile("seed", self.kv_cache_dtype))


SERVER_CONFIGS = {
    "116K": ServerConfig("mem 0.85, bf16 KV", 0.85, "bf16", 0.0),
    "159K": ServerConfig("mem 0.88, bf16 KV, hicache 48 GB", 0.88, "bf16", 48.0),
    "376K": ServerConfig("mem 0.90, fp8_e4m3 KV, hicache 48 GB", 0.90, "fp8_e4m3", 48.0),
}


@dataclass(frozen=True, slots=True)
class Job:
    """M samples: (prompt tokens, output tokens, finish reason) each; seeded, so every client gets the same job."""

    profile: LengthProfile
    lengths: tuple[tuple[int, int, str], ...]

    @classmethod
    def sample(cls, profile: LengthProfile, samples: int, seed: int) -> Job:
        rng = random.Random(f"{profile.name}-{seed}")
        out = []
        for _ in range(samples):
            p = max(8, round(rng.lognormvariate(math.log(profile.prompt_median), profile.prompt_sigma)))
            o = max(1, round(rng.lognormvariate(math.log(profile.output_median), profile.output_sigma)))
            out.append((p, min(o, profile.max_new_tokens), "length" if o >= profile.max_new_tokens else "stop"))
        return cls(profile, tuple(out))

    def initial_tokens_per_request(self) -> float:
        """What the pipeline can know before any completion: the mean prompt plus half of max_new_tokens."""
        mean_prompt = sum(p for p, _, _ in self.lengths) / len(self.lengths)
        return mean_prompt + self.profile.max_new_tokens / 2


@dataclass(frozen=True)
class RunResult:
    policy: str
    samples: int
    completed: int
    makespan_s: float
    completion_tokens: int
    gen_tok_s: float
    samples_per_s: float
    recompute_share: float  # re-prefilled tokens after retractions / generated tokens
    retractions: int
    peak_queued: int
    peak_running: int
    median_running: float


def snapshot(engine: Engine) -> LoadSnapshot:
    """What the pipeline's poller builds from /v1/loads and /metrics."""
    loads, counters = engine.loads(), engine.counters()
    return LoadSnapshot(
        t_s=engine.now_s, running=loads["num_running_reqs"], queued=loads["num_waiting_reqs"],
        used_tokens=loads["num_used_tokens"], token_usage=loads["token_usage"],
        retractions_total=counters["num_retracted_requests_total"],
        gen_tokens_total=counters["generation_tokens_total"], gen_throughput=loads["gen_throughput"],
        new_token_ratio=engine.reported_new_token_ratio)


def trace_point(engine: Engine, snap: LoadSnapshot, window: int) -> dict:
    """One per-second row of a run's server trace: the figures bench/gpu records from /metrics."""
    return {"t_s": round(snap.t_s, 3), "running": snap.running, "queued": snap.queued,
            "token_usage": snap.token_usage, "new_token_ratio": round(engine.reported_new_token_ratio, 4),
            "used_tokens": snap.used_tokens, "gen_throughput": snap.gen_throughput,
            "retractions_total": snap.retractions_total, "gen_tokens_total": snap.gen_tokens_total, "window": window}


def send_request(engine: Engine, job: Job, index: int) -> None:
    p, o, reason = job.lengths[index]
    base = (index + 1) << 20  # unique token ids: no prefix sharing between samples
    engine.add_request(f"r{index}", range(base, base + p), range(base + p, base + p + o), reason,
                       max_new_tokens=job.profile.max_new_tokens)


def result_of(name: str, engine: Engine, total: int, completed: int, tokens: int, peak_queued: int,
            running: list[int]) -> RunResult:
    counters = engine.counters()
    makespan = engine.now_s
    ordered = sorted(running) or [0]
    return RunResult(
        policy=name, samples=total, completed=completed, makespan_s=makespan, completion_tokens=tokens,
        gen_tok_s=tokens / makespan, samples_per_s=completed / makespan,
        recompute_share=counters["recomputed_prefill_tokens_total"] / max(1, counters["generation_tokens_total"]),
        retractions=counters["num_retracted_requests_total"], peak_queued=peak_queued,
        peak_running=max(ordered), median_running=ordered[len(ordered) // 2])
