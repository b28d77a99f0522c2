"""Running estimates of request size learned from completions (pure arithmetic)."""

from __future__ import annotations

from collections import deque


class RequestSizes:
    """Tokens per request, from the last `history` completions blended with a prior: `final_tokens` (F) at
    its end, `held_tokens` the mean KV over its life, weighted by decode time: sum c*(p + c/2) / sum c."""

    def __init__(self, prior_tokens: float, prior_weight: float, history: int) -> None:
        self._prior = max(1.0, float(prior_tokens))
        self._prior_weight = prior_weight
        self._recent: deque[tuple[int, int, float]] = deque(maxlen=history)
        self._sum_final = self._sum_weighted_held = self._sum_weight = self._sum_latency_s = 0.0
        self.count = 0  # completions ever observed

    def observe(self, prompt_tokens: int, completion_tokens: int, latency_s: float) -> None:
        """Add one completed request (its token counts from the response's usage)."""
        if len(self._recent) == self._recent.maxlen:
            self._account(*self._recent[0], sign=-1.0)
        item = (max(0, prompt_tokens), max(0, completion_tokens), max(0.0, latency_s))
        self._recent.append(item)
        self._account(*item, sign=1.0)
        self.count += 1

    def _account(self, p: int, c: int, latency_s: float, sign: float) -> None:
        weight = max(1, c)
        self._sum_final += sign * (p + c)
        self._sum_weighted_held += sign * weight * (p + c / 2)
        self._sum_weight += sign * weight
        self._sum_latency_s += sign * latency_s

    @property
    def final_tokens(self) -> float:
        """F: prompt + completion tokens per request (prior-blended mean)."""
        n = len(self._recent)
        return (self._prior_weight * self._prior + self._sum_final) / (self._prior_weight + n)

    @property
    def observed_final_tokens(self) -> float | None:
        """Mean prompt + completion tokens of the completions kept (no prior); None before any."""
        n = len(self._recent)
        return self._sum_final / n if n else None

    @property
    def held_tokens(self) -> float:
        """Mean KV tokens a running request holds in steady state (prior-blended; the prior is F)."""
        n = len(self._recent)
        if n == 0:
            return self._prior
        observed = self._sum_weighted_held / self._sum_weight
        return (self._prior_weight * self._prior + n * observed) / (self._prior_weight + n)

    @property
    def mean_latency_s(self) -> float | None:
        n = len(self._recent)
        return self._sum_latency_s / n if n else None
