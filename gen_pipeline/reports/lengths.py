"""Prompt lengths for `check`: tokens with the served model's tokenizer when `transformers` loads it offline, else
characters; the context length when the profile or a local model folder says it."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.records import Prompt

CHARS_PER_TOKEN = 4  # as sources.estimate_prompt_tokens; errs low for code and CJK text


@dataclass
class Lengths:
    unit: str  # "tokens" | "characters"
    how: str  # what measured them, or why no tokenizer
    values: list[int]  # one per measured prompt (system + user turns)

    def tokens(self, value: int) -> int:
        return value if self.unit == "tokens" else math.ceil(value / CHARS_PER_TOKEN)

    def overflowing(self, max_new_tokens: int, context_tokens: int) -> int:
        """How many measured prompts plus max_new_tokens exceed the context length: SGLang 0.5.17 refuses a
        request whose input + max_new_tokens > context_len (TokenizerManager._validate_one_request, unless
        the server runs with --allow-auto-truncate)."""
        return sum(1 for x in self.values if self.tokens(x) + max_new_tokens > context_tokens)

    def median_tokens(self) -> int:
        v = sorted(self.values)
        return self.tokens(v[len(v) // 2]) if v else 0

    def format(self, max_new_tokens: int, context: tuple[int | None, str]) -> list[str]:
        if not self.values:
            return ["  prompt length: no valid prompt to measure"]
        v = sorted(self.values)
        pick = {q: v[min(len(v) - 1, int(q / 100 * len(v)))] for q in (50, 90, 99)}
        lines = [f"  prompt length in {self.unit} ({self.how}), over {len(v):,} prompts: min {v[0]:,}, "
                 f"median {pick[50]:,}, p90 {pick[90]:,}, p99 {pick[99]:,}, max {v[-1]:,}"]
        ctx, where = context
        approx, longest = "" if self.unit == "tokens" else "~", self.tokens(v[-1])
        if approx:
            lines.append(f"  tokens below are estimates at {CHARS_PER_TOKEN} characters per token")
        need = (f"longest prompt {approx}{longest:,} tokens + max_new_tokens {max_new_tokens:,} = "
                f"{approx}{longest + max_new_tokens:,}")
        if ctx is None:
            return [*lines, f"  context length: unknown ({where}); {need}"]
        over = self.overflowing(max_new_tokens, ctx)
        return [*lines, f"  context length {ctx:,} tokens ({where}): {need}" + (
            f": {over:,} of {len(v):,} prompts do not fit; SGLang refuses those requests (HTTP 400, recorded as final "
            "failures). Lower max_new_tokens or raise context_length." if over else ": fits")]


def measure(prompts: list[Prompt], profile: ServerProfile | None) -> Lengths:
    tok, why = _tokenizer(profile)
    if tok is None:
        return Lengths("characters", why, [p.prompt_chars for p in prompts])
    texts = ["\n".join(m["content"] for m in p.messages if m["role"] != "assistant") for p in prompts]
    return Lengths("tokens", why, [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]])


def _tokenizer(profile: ServerProfile | None) -> tuple[Any, str]:
    """(tokenizer, "the X tokenizer") or (None, why there is none); never downloads."""
    if profile is None:
        return None, "no server profile, so no tokenizer"
    if importlib.util.find_spec("transformers") is None:
        return None, "transformers is not installed, so no tokenizer"
    path = profile.tokenizer_path
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=profile.trust_remote_code)
    except Exception as e:  # any failure means: measure characters instead
        return None, f"the tokenizer of {path} does not load offline ({type(e).__name__}), so no tokenizer"
    return tok, f"the {path} tokenizer, system + user turns, chat template not counted"


def context_length(profile: ServerProfile | None) -> tuple[int | None, str]:
    """(tokens, where read) from the profile's context_length or a local model's config.json."""
    if profile is None:
        return None, "no server profile"
    if profile.context_length:
        return profile.context_length, f"{profile.where} context_length"
    config = Path(profile.model_path) / "config.json"
    if config.is_file():
        try:
            cfg = json.loads(config.read_text())
            cfg = cfg if isinstance(cfg, dict) else {}
            value = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value, f"{config} max_position_embeddings"
        except (OSError, ValueError):
            pass
    return None, f"set context_length in {profile.where}, or serve a local model folder with a config.json"
