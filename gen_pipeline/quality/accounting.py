"""The quality gate's figures over a dataset, from the rows' meta.per_turn and errors.jsonl. The GPU-seconds saved
by early aborts (SAVED_FORMULA) assume a loop would have run to its cap and ignore the KV it would have held: an
estimate, a lower bound, stated as such wherever it is shown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SAVED_FORMULA = "tokens not decoded up to max_new_tokens × the runs' wall time × GPUs ÷ every token they decoded"
FAILURE_KEYS = ("loops", "empty", "tokens_not_decoded", "discarded_tokens")  # what Failure.extra records


def int_or_zero(v: Any) -> int:
    """An integer field of a row, 0 when absent or not an integer (booleans are not)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def add_meta(counts: dict[str, int], meta: Mapping[str, Any]) -> None:
    """A written row's turns (meta.per_turn; rows written before the gate have none: nothing added)."""
    per_turn = meta.get("per_turn")
    for t in per_turn if isinstance(per_turn, list) else ():
        if not isinstance(t, dict):
            continue
        _add(counts, "turns", 1)
        for key in FAILURE_KEYS:
            _add(counts, key, int_or_zero(t.get(key)))
        _add(counts, "retried_turns", int_or_zero(t.get("attempts")) > 1)
        _add(counts, "loops_kept", t.get("finish_reason") == "loop")
        _add(counts, "leaks", bool(t.get("leak")))
        if (verify_ct := int_or_zero(t.get("spec_verify_ct"))) > 0:  # a draft's acceptance (run/answer.py)
            _add(counts, "spec_turns", 1)
            _add(counts, "spec_tokens", int_or_zero(t.get("completion_tokens")))
            _add(counts, "spec_verify_ct", verify_ct)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    if n:
        counts[key] = counts.get(key, 0) + int(n)


_LEAK_DETAILS = ("think_marker:", "reasoning_in_content:", "cut_in_reasoning:")  # quality.LeakReason's leaks


def add_failure(counts: dict[str, int], row: Mapping[str, Any]) -> None:
    """A failed sample's record (errors.jsonl): the loops and empty answers of its turns, and the leak that
    failed it (truncated = "drop": reason "leak", or "truncated" for a leak cut by max_new_tokens, its detail
    naming the leak, run/answer.judge)."""
    for key in FAILURE_KEYS:
        _add(counts, key, int_or_zero(row.get(key)))
    detail = row.get("detail")
    _add(counts, "leaks", row.get("reason") == "leak" or (row.get("reason") == "truncated" and isinstance(detail, str)
                                                          and detail.startswith(_LEAK_DETAILS)))


def merged(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + int_or_zero(v)
    return out


def gpu_s_per_token(wall_s: float | None, gpus: int | None, decoded_tokens: int) -> float | None:
    """GPU-seconds one decoded token cost on average over the runs (None when unknown)."""
    return wall_s * gpus / decoded_tokens if wall_s and gpus and decoded_tokens > 0 else None


def saved_gpu_s(counts: Mapping[str, int], per_token: float | None) -> float | None:
    return None if per_token is None else counts.get("tokens_not_decoded", 0) * per_token


def decoded_tokens(counts: Mapping[str, int], written_completion_tokens: int) -> int:
    """Every token the runs decoded: the written turns' and the discarded attempts'."""
    return written_completion_tokens + counts.get("discarded_tokens", 0)


def format_gate(counts: Mapping[str, int], saved: float | None = None, unit: str = "GPU") -> str:
    """One line: `quality gate: 12 loops caught (3 kept cut), 4 empty answers retried, 2 leaks flagged; 48,512
    tokens not decoded (~0.41 GPU-h saved), 6,020 decoded and discarded`; "" when the gate saw nothing."""
    loops, empty, leaks = counts.get("loops", 0), counts.get("empty", 0), counts.get("leaks", 0)
    not_decoded, discarded = counts.get("tokens_not_decoded", 0), counts.get("discarded_tokens", 0)
    if not (loops or empty or leaks or not_decoded or discarded):
        return ""
    kept = counts.get("loops_kept", 0)
    parts = [f"{loops:,} loop{'' if loops == 1 else 's'} caught" + (f" ({kept:,} kept cut)" if kept else ""),
             f"{empty:,} empty answer{'' if empty == 1 else 's'} retried", f"{leaks:,} leak{'' if leaks == 1 else 's'} "
             "flagged"]
    tail = f"{not_decoded:,} tokens not decoded"
    if saved is not None:
        tail += f" (~{saved / 3600:.2f} {unit}-h saved)" if saved >= 3600 else f" (~{saved:.1f} {unit}-s saved)"
    return f"quality gate: {', '.join(parts)}; {tail}, {discarded:,} decoded and discarded"


def spec_figure(counts: Mapping[str, int], server_wide: float | None) -> dict[str, Any] | None:
    """The server's draft acceptance: over the turns that recorded one (completion tokens ÷ verify steps,
    SGLang's spec_accept_length pooled), else the server-wide gauge (scope "server"); None: no draft ran."""
    turns, verify_ct = counts.get("spec_turns", 0), counts.get("spec_verify_ct", 0)
    if turns and verify_ct:
        return {"accept_length": round(counts.get("spec_tokens", 0) / verify_ct, 3), "turns": turns, "scope": "turns"}
    return None if server_wide is None else {"accept_length": server_wide, "turns": 0, "scope": "server"}


def format_spec(counts: Mapping[str, int], server_wide: float | None) -> str:
    """One line on spec_figure (status, the card); "" when no draft ran."""
    if (fig := spec_figure(counts, server_wide)) is None:
        return ""
    head = f"draft acceptance: {fig['accept_length']:.2f} tokens per verify step"
    if fig["scope"] == "turns":
        return f"{head} over {fig['turns']:,} turn{'' if fig['turns'] == 1 else 's'}"
    return (f"{head}, server-wide (sglang:spec_accept_length); per turn needs whole answers: SGLang 0.5.17 "
            "returns meta_info only without streaming (generation.on_loop = \"off\" gives it, without the loop "
            "gate's early stop)")
