"""Speculative decoding as a client sees it (no speed effect): each finished request's acceptance
figures, as SGLang 0.5.17's managers/tokenizer_manager.py `_calculate_spec_decoding_metrics` puts them
in meta_info, and the server-wide figure behind /metrics `sglang:spec_accept_length`."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any


class Speculation:
    """`--speculative-algorithm` set: per request, an acceptance length drawn around `--sim-accept-length`
    (seeded by the prompt, so figures repeat), capped at `--speculative-num-draft-tokens`."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.on = ns.speculative_algorithm is not None
        self.draft_tokens = ns.speculative_num_draft_tokens or 4  # SGLang picks one when unset; the sim 4
        self.accept_length = min(ns.sim_accept_length, float(self.draft_tokens))
        self.seed = ns.sim_seed
        self.tokens = self.verify_ct = self.correct = 0  # over every finished request (SGLang: per log interval)

    def meta_info(self, prompt_ids: Sequence[int], completion_tokens: int) -> dict[str, Any]:
        """The spec_* keys of one finished request's meta_info; {} without a draft or a decoded token
        (SGLang sets them only when spec_verify_ct > 0)."""
        if not self.on or completion_tokens <= 0:
            return {}
        rng = random.Random(hash((self.seed, tuple(prompt_ids))))
        length = min(max(1.0, self.accept_length * rng.uniform(0.8, 1.2)), self.draft_tokens)
        verify_ct = max(1, round(completion_tokens / length))
        correct = max(0, completion_tokens - verify_ct)  # each verify step gives its accepted drafts + 1 bonus
        proposed = verify_ct * (self.draft_tokens - 1)
        self.tokens, self.verify_ct, self.correct = (self.tokens + completion_tokens, self.verify_ct + verify_ct,
                                                     self.correct + correct)
        return {"spec_accept_rate": correct / proposed if proposed else 0.0,
                "spec_accept_length": completion_tokens / verify_ct, "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed, "spec_verify_ct": verify_ct}

    def gauges(self) -> dict[str, float]:
        """sglang:spec_accept_length and spec_accept_rate (0 without a draft, as SGLang's defaults)."""
        proposed = self.verify_ct * (self.draft_tokens - 1)
        return {"spec_accept_length": self.tokens / self.verify_ct if self.verify_ct else 0.0,
                "spec_accept_rate": self.correct / proposed if proposed else 0.0}
