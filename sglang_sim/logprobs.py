"""/generate's logprob fields (return_logprob, top_logprobs_num, logprob_start_len,
return_text_in_logprobs) as SGLang 0.5.17 parses and returns them: meta_info gets
input_token_logprobs / output_token_logprobs as [logprob, token_id, text or None] lists and
input_top_logprobs / output_top_logprobs as one such list per position (None where SGLang has
none), as python/sglang/srt/managers/tokenizer_manager.py add_logprob_to_meta_info does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_sim import logprob_model as M
from sglang_sim.tokenizer import decode

FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")


class LogprobError(ValueError):
    """A bad logprob field (the caller answers 400)."""


@dataclass
class LogprobPlan:
    """What a request with return_logprob asked for, and the distributions behind its tokens."""

    top_k: int
    start: int  # absolute position of the first input logprob; len(input) = none
    with_text: bool
    input_ids: list[int]
    input: list[M.Dist | None]
    output: list[M.Dist]


def perturb_rate(ns: Any) -> float:
    """--sim-kv-perturb applies only to a simulator whose --kv-cache-dtype is fp8."""
    return ns.sim_kv_perturb if ns.kv_cache_dtype in FP8_DTYPES else 0.0


def _int_field(body: dict[str, Any], name: str, default: int, low: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise LogprobError(f"{name} must be an integer >= {low} (got {value!r}).")
    return value


def plan(ns: Any, body: dict[str, Any], prompt_ids: list[int], n_tokens: int,
         sampling: dict[str, Any], sample_seed: int) -> tuple[list[int], LogprobPlan | None]:
    """(output ids, the logprob plan or None when return_logprob is off)."""
    if not body.get("return_logprob"):
        return [], None
    top_k = _int_field(body, "top_logprobs_num", 0, 0)
    if top_k > M.N_CANDIDATES:
        raise LogprobError(f"top_logprobs_num {top_k} is above the simulator's {M.N_CANDIDATES} candidates.")
    start = _int_field(body, "logprob_start_len", -1, -1)
    if start > len(prompt_ids):
        raise LogprobError(f"logprob_start_len={start} is higher than the number of input tokens "
                           f"{len(prompt_ids)}. Please use a smaller logprob_start_len.")
    start = len(prompt_ids) if start == -1 else start
    rate, seed = perturb_rate(ns), ns.sim_seed
    temperature = float(sampling.get("temperature", 1.0))
    out_ids, out_dists = M.generate(seed, prompt_ids, n_tokens, rate, temperature, sample_seed)
    in_dists = M.input_dists(seed, prompt_ids, start, rate) if start < len(prompt_ids) else []
    return out_ids, LogprobPlan(top_k, start, bool(body.get("return_text_in_logprobs")),
                                prompt_ids, in_dists, out_dists)


def _entry(lp: float | None, tid: int, with_text: bool) -> list[Any]:
    return [lp, tid, decode([tid]) if with_text else None]


def meta_info(p: LogprobPlan, output_ids: list[int]) -> dict[str, Any]:
    """The logprob keys of meta_info for the first len(output_ids) output tokens."""
    in_ids = p.input_ids[p.start:]
    out_dists = p.output[: len(output_ids)]
    info: dict[str, Any] = {
        "input_token_logprobs": [_entry(None if d is None else d.logprob(t), t, p.with_text)
                                 for d, t in zip(p.input, in_ids, strict=False)],
        "output_token_logprobs": [_entry(d.logprob(t), t, p.with_text)
                                  for d, t in zip(out_dists, output_ids, strict=False)],
    }
    info["output_token_logprobs_length"] = len(info["output_token_logprobs"])
    if p.top_k > 0:
        info["input_top_logprobs"] = [None if d is None else [_entry(lp, t, p.with_text) for lp, t in d.top(p.top_k)]
                                      for d in p.input]
        info["output_top_logprobs"] = [[_entry(lp, t, p.with_text) for lp, t in d.top(p.top_k)] for d in out_dists]
    return info
