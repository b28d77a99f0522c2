"""The KV-dtype probe's arithmetic (pure). Why the thresholds: a drafter trained on fp8-KV outputs learns another
token than the bf16 target picks at about the top-1 change share d of positions, so its accept rate drops by at
most about d; mean KL plays the same part for sampled data."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

TOP1_FINE, TOP1_CAUTION = 0.01, 0.03
KL_FINE, KL_CAUTION = 0.01, 0.05
THRESHOLDS = {"top1_change_fine": TOP1_FINE, "top1_change_caution": TOP1_CAUTION, "kl_mean_fine": KL_FINE,
              "kl_mean_caution": KL_CAUTION}
KL_ESTIMATOR = ("KL(P_ref || Q_cmp) over the reference top-k tokens plus one tail bucket; a lower bound "
                "(bucketing never raises KL; a token missing from the compare top-k gets its k-th probability)")
DIVERGENCE_BUCKETS = ((0, 1), (1, 10), (10, 50), (50, 100), (100, 200), (200, 500), (500, None))
_EPS = 1e-12


@dataclass(frozen=True)
class Position:
    """One scored token: its logprob and the top-k (logprob, token id) there, best first."""

    token: int
    logprob: float
    top: tuple[tuple[float, int], ...]


@dataclass
class PromptResult:
    """One prompt's figures; first_divergence is None when the free-run outputs are equal."""

    id: str
    prompt_tokens: int
    ref_tokens: int
    cmp_tokens: int
    exact_match: bool
    first_divergence: int | None
    positions: int
    top1_agree: int
    abs_dlogprob_mean: float
    abs_dlogprob_max: float
    kl_mean: float
    abs_dlogprobs: list[float]
    kls: list[float]
    cache: tuple[int, int] = (0, 0)  # (cached tokens, reusable prefix tokens) of the compare's scoring chunks

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["abs_dlogprobs"], d["kls"], d["cache"]
        return d


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the token sequences differ (a length difference counts); None if equal."""
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def kl_topk(p_top: Sequence[tuple[float, int]], q_top: Sequence[tuple[float, int]]) -> float:
    """KL(P_ref || Q_cmp) over the reference's top-k tokens plus one tail bucket: merging tokens never raises KL
    (log-sum inequality), so read it as "at least this much"."""
    if not p_top or not q_top:
        return 0.0
    q_lp = {t: lp for lp, t in q_top}
    q_floor = min(lp for lp, _ in q_top)
    kl = p_mass = q_mass = 0.0
    for lp, t in p_top:
        p, q = math.exp(lp), math.exp(q_lp.get(t, q_floor))
        kl += p * (lp - math.log(max(q, _EPS)))
        p_mass, q_mass = p_mass + p, q_mass + q
    p_tail, q_tail = max(1.0 - p_mass, _EPS), max(1.0 - q_mass, _EPS)
    kl += p_tail * math.log(p_tail / q_tail)
    return max(kl, 0.0)


def compare_prompt(pid: str, prompt_tokens: int, ref_free: Sequence[int], cmp_free: Sequence[int],
                   ref_tf: Sequence[Position], cmp_tf: Sequence[Position]) -> PromptResult:
    """Free-run agreement plus teacher-forced agreement over the reference trajectory."""
    div = first_divergence(ref_free, cmp_free)
    pairs = list(zip(ref_tf, cmp_tf, strict=False))
    agree = sum(bool(r.top and c.top and r.top[0][1] == c.top[0][1]) for r, c in pairs)
    dlp, kls = [abs(r.logprob - c.logprob) for r, c in pairs], [kl_topk(r.top, c.top) for r, c in pairs]
    return PromptResult(pid, prompt_tokens, len(ref_free), len(cmp_free), div is None, div, len(dlp), agree,
                        _mean(dlp), max(dlp, default=0.0), _mean(kls), dlp, kls)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no data."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))] if s else 0.0


def aggregate(results: Sequence[PromptResult]) -> dict[str, Any]:
    """Figures over all prompts; positions are pooled (every scored token counts once)."""
    dlp = [x for r in results for x in r.abs_dlogprobs]
    kls = [x for r in results for x in r.kls]
    positions = sum(r.positions for r in results)
    agree = sum(r.top1_agree for r in results)
    at = [r.first_divergence for r in results if r.first_divergence is not None]
    hist = {f"{lo}-{hi - 1}" if hi else f"{lo}+": sum(1 for x in at if x >= lo and (hi is None or x < hi))
            for lo, hi in DIVERGENCE_BUCKETS}
    return {
        "prompts": len(results),
        "exact_match_share": sum(r.exact_match for r in results) / len(results) if results else 0.0,
        "first_divergence": {"diverged_prompts": len(at), "median": statistics.median(at) if at else None,
                             "p10": percentile(at, 10) if at else None, "p90": percentile(at, 90) if at else None,
                             "histogram": hist},
        "positions": positions,
        "top1_agreement_share": agree / positions if positions else 1.0,
        "top1_change_share": 1.0 - agree / positions if positions else 0.0,
        "abs_dlogprob_mean": _mean(dlp), "abs_dlogprob_p99": percentile(dlp, 99),
        "kl_mean": _mean(kls), "kl_p99": percentile(kls, 99),
    }


def verdict(agg: dict[str, Any], kv_label: str = "fp8") -> tuple[str, str]:
    """("fine" | "caution" | "prefer-bf16", the line a user reads); kv_label names the compare KV dtype."""
    d, kl = agg["top1_change_share"], agg["kl_mean"]
    level = 0 if d <= TOP1_FINE else 1 if d <= TOP1_CAUTION else 2
    level = max(level, 0 if kl <= KL_FINE else 1 if kl <= KL_CAUTION else 2)
    head = (f"{kv_label} KV changes top-1 on {100 * d:.2f} % of {agg['positions']:,} positions "
            f"(mean KL >= {kl:.4f} nats)")
    tails = (": fine for training data.",
             ": measurable; prefer bf16 KV when the drafter will serve a bf16 target and the time allows.",
             ": prefer bf16 KV for training data (the drafter would learn a shifted distribution).")
    return ("fine", "caution", "prefer-bf16")[level], head + tails[level]
