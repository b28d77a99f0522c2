"""The [sampling] table of a dataset TOML: what each request asks the server for, and the ranges
SGLang accepts (checked before any request). Pure; no async library."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

from gen_pipeline.errors import ConfigError

# SGLang 0.5.17 entrypoints/openai/protocol.py ReasoningEffortTier (its float form, an extension for a few
# models, is left out: meta.sampling records one type per key)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


@dataclass(frozen=True)
class SamplingConfig:
    """What each request asks the server for. Keys after top_p are sent only when set."""

    max_new_tokens: int = 2048
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # the chat template's keyword arguments
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into the request body verbatim

    def __hash__(self) -> int:  # extra_body is a dict; the client caches per config
        return hash(orjson.dumps(self.as_dict(), option=orjson.OPT_SORT_KEYS))

    def as_dict(self) -> dict[str, Any]:
        """The settings that are set: what meta.sampling records and the fingerprint holds (a config
        without the optional keys keeps the fingerprint it had before they existed)."""
        d = asdict(self)
        return {k: v for k, v in d.items() if k in _ALWAYS or v not in (None, (), {})}


_ALWAYS = ("max_new_tokens", "temperature", "top_p")
# Body keys the pipeline sets itself; extra_body must not set them.
RESERVED_BODY_KEYS = ("model", "messages", "stream", "max_tokens", "max_completion_tokens", "n")


# What SGLang accepts, declared once: SGLang 0.5.17 python/sglang/srt/sampling/sampling_params.py,
# SamplingParams.verify (run on every request, after the model has loaded: a value out of range
# fails every request of a run). top_k (-1 or at least 1) and max_new_tokens are checked below.
SAMPLING_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {  # (accepts a finite value, words)
    "temperature": (lambda v: v >= 0, "a finite number of at least 0 (0 = greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "above 0 and at most 1"),
    "min_p": (lambda v: 0 <= v <= 1, "between 0 and 1"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "between -2 and 2"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "between -2 and 2"),
    "repetition_penalty": (lambda v: 0 < v <= 2, "above 0 and at most 2 (1 = no penalty)"),
}


def check_sampling(s: SamplingConfig, where: str) -> None:
    """Ranges as SGLang's SamplingParams.verify checks them (SAMPLING_RANGES), before any request."""
    if s.max_new_tokens <= 0:
        raise ConfigError(f"{where}max_new_tokens = {s.max_new_tokens} must be positive.")
    for key, (accepts, words) in SAMPLING_RANGES.items():
        value = getattr(s, key)
        if value is not None and not (math.isfinite(value) and accepts(value)):
            raise ConfigError(f"{where}{key} = {value} must be {words}.")
    if s.top_k is not None and s.top_k != -1 and s.top_k < 1:
        raise ConfigError(f"{where}top_k = {s.top_k} must be -1 (no top-k) or at least 1.")
    if any(not x for x in s.stop):
        raise ConfigError(f"{where}stop = {list(s.stop)!r} must not contain an empty string.")
    for key in s.extra_body:
        if key in RESERVED_BODY_KEYS:
            raise ConfigError(f"{where}extra_body.{key}: the pipeline sets {key} itself. Remove it.")
        if key in _SAMPLING_KEYS:
            raise ConfigError(f"{where}extra_body.{key}: set it as {where.split(': ')[-1]}{key} instead.")


_SAMPLING_KEYS = frozenset(f for f in SamplingConfig.__dataclass_fields__ if f != "extra_body") | {"max_tokens"}
