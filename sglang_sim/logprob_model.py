"""A deterministic next-token "model" for the simulator's logprob path, with a perturbed-KV mode.

The distribution at a position is a pure function of the context before it (a rolling 64-bit
hash of the token ids and --sim-seed), so two simulators score the same context the same way.
Each distribution has 32 candidates holding 95 % of the mass (the rest spread over the
vocabulary) and a top-1 margin of at least 0.7 nats.

Perturbed KV (fp8 KV with --sim-kv-perturb RATE): every logit moves by seeded noise of at most
0.1 nats (never enough to flip top-1), and at a seeded share RATE of contexts the top two swap.
So teacher-forced top-1 disagreement between a bf16 and a perturbed simulator is RATE up to
sampling error over the positions scored.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sglang_sim.tokenizer import _POOL_IDS, VOCAB_SIZE

N_CANDIDATES = 32
TAIL_MASS = 0.05
MIN_TOP1_GAP = 0.7
NOISE_SIGMA, NOISE_CAP = 0.03, 0.1
_MASK = (1 << 64) - 1
_PERTURB_SALT = 0x5EED_F8F8_0BAD_CAFE
_CANDIDATE_POOL = sorted(set(_POOL_IDS))
_TAIL_LOGPROB = math.log(TAIL_MASS / (VOCAB_SIZE - N_CANDIDATES))


def mix(h: int, token: int) -> int:
    """The context hash after appending `token` (splitmix64-style; cheap and well spread)."""
    h = (h ^ (token + 0x9E3779B97F4A7C15)) & _MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


def prefix_hashes(seed: int, ids: list[int]) -> list[int]:
    """hashes[i] = the hash of the context ids[:i], for i in 0..len(ids)."""
    h = mix(0, seed & _MASK)
    out = [h]
    for t in ids:
        h = mix(h, t)
        out.append(h)
    return out


@dataclass(frozen=True)
class Dist:
    """Candidates sorted by logprob, highest first; any other token has tail_logprob."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def logprob(self, token: int) -> float:
        try:
            return self.logprobs[self.ids.index(token)]
        except ValueError:
            return _TAIL_LOGPROB

    def top(self, k: int) -> list[tuple[float, int]]:
        return list(zip(self.logprobs[:k], self.ids[:k], strict=True))


def distribution(h: int, perturb_rate: float = 0.0) -> Dist:
    """The next-token distribution for context hash `h` (perturbed when perturb_rate > 0)."""
    rng = random.Random(h)
    ids = rng.sample(_CANDIDATE_POOL, N_CANDIDATES)
    logits = [0.0, -(MIN_TOP1_GAP + 2.0 * rng.random())]
    while len(logits) < N_CANDIDATES:
        logits.append(logits[-1] - rng.expovariate(2.0))
    if perturb_rate > 0:
        prng = random.Random(h ^ _PERTURB_SALT)
        logits = [x + max(-NOISE_CAP, min(NOISE_CAP, prng.gauss(0.0, NOISE_SIGMA))) for x in logits]
        if prng.random() < perturb_rate:
            logits[0], logits[1] = logits[1], logits[0]
    order = sorted(range(N_CANDIDATES), key=lambda i: -logits[i])
    top = logits[order[0]]
    norm = top + math.log(sum(math.exp(x - top) for x in logits)) - math.log(1.0 - TAIL_MASS)
    return Dist(tuple(ids[i] for i in order), tuple(logits[i] - norm for i in order))


def generate(seed: int, prompt_ids: list[int], n_tokens: int, perturb_rate: float,
             temperature: float, sample_seed: int) -> tuple[list[int], list[Dist]]:
    """(output ids, the distribution each was drawn from): greedy at temperature 0, else sampled."""
    h = prefix_hashes(seed, prompt_ids)[-1]
    rng = random.Random(sample_seed)
    out, dists = [], []
    for _ in range(n_tokens):
        d = distribution(h, perturb_rate)
        tok = d.ids[0] if temperature <= 0 else _sample(d, temperature, rng)
        out.append(tok)
        dists.append(d)
        h = mix(h, tok)
    return out, dists


def _sample(d: Dist, temperature: float, rng: random.Random) -> int:
    weights = [math.exp(lp / temperature) for lp in d.logprobs]
    return rng.choices(d.ids, weights=weights)[0]


def input_dists(seed: int, ids: list[int], start: int, perturb_rate: float) -> list[Dist | None]:
    """Per position start..len(ids)-1 the distribution that scored ids[pos]; None at `start`
    (SGLang reports no logprob for the first position it returns)."""
    hashes = prefix_hashes(seed, ids)
    return [None] + [distribution(hashes[pos], perturb_rate) for pos in range(start + 1, len(ids))]
