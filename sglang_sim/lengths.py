"""Seeded output lengths: the same request (prompt + sampling params) gets the same length and
the same output tokens in every process, so runs repeat."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from typing import Any

import orjson


def request_seed(sim_seed: int, prompt: str | list[int], sampling: Mapping[str, Any]) -> int:
    """64-bit seed from the sim seed, the rendered prompt (or its ids) and the sampling params."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(sim_seed).encode())
    h.update(b"\x00")
    h.update(prompt.encode() if isinstance(prompt, str) else orjson.dumps(prompt))
    h.update(b"\x00")
    h.update(orjson.dumps(dict(sampling), option=orjson.OPT_SORT_KEYS))
    return int.from_bytes(h.digest(), "big")


def draw_length(seed: int, mean_tokens: float, sigma: float) -> int:
    """Lognormal output length in tokens with mean `mean_tokens` and log-spread `sigma` (>= 1)."""
    if sigma <= 0:
        return max(1, round(mean_tokens))
    mu = math.log(mean_tokens) - sigma * sigma / 2  # so that E[X] = mean_tokens
    return max(1, round(random.Random(seed).lognormvariate(mu, sigma)))


def cap_length(drawn: int, max_new_tokens: int) -> tuple[int, str]:
    """(tokens to generate, finish_reason): "length" when the draw exceeds `max_new_tokens`."""
    if drawn > max_new_tokens:
        return max_new_tokens, "length"
    return drawn, "stop"
