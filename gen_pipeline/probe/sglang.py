"""The probe's requests to SGLang (read from SGLang 0.5.17's python/sglang/srt/). Run it on servers with no other
traffic: a batch that mixes greedy and sampled requests takes the logprobs after top-k/top-p filtering
(layers/sampler.py)."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import anyio

from gen_pipeline.errors import ServerError
from gen_pipeline.http import Http, HttpError
from gen_pipeline.probe.metrics import Position

ATTEMPTS = 3


class ProbeRequestError(Exception):
    """One prompt's request failed (the prompt is reported as failed; the probe goes on)."""


class NoTokenize(Exception):
    """The server answered 404 on /tokenize."""


async def _post(http: Http, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST → JSON object; retries transport errors and 5xx; ProbeRequestError on the rest."""
    for attempt in range(ATTEMPTS):
        try:
            reply = await http.post_json(url, body)
        except HttpError as e:
            err = str(e)
        else:
            if reply.status == 200:
                with contextlib.suppress(HttpError):
                    if isinstance(data := reply.json(), dict):
                        return data
                raise ProbeRequestError(f"{url} answered 200 with a body that is not a JSON object: "
                                        f"{reply.text[:200]!r}")
            err = f"HTTP {reply.status}: {' '.join(reply.text[:300].split())}"
            if reply.status == 404 and url.endswith("/tokenize"):
                raise NoTokenize(url)
            if reply.status < 500:
                raise ProbeRequestError(f"{url}: {err}")
        if attempt + 1 < ATTEMPTS:
            await anyio.sleep(0.5 * 2**attempt)
    raise ProbeRequestError(f"{url}: {err} (after {ATTEMPTS} attempts)")


async def prompt_ids(http: Http, url: str, model: str, messages: list[dict[str, str]],
                     chat_template_kwargs: dict[str, Any] | None) -> list[int]:
    """The chat-templated prompt's ids: /tokenize, else (an SGLang without it, 0.5.13+) a one-token
    /v1/chat/completions with return_prompt_token_ids."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if chat_template_kwargs:
        body["chat_template_kwargs"] = chat_template_kwargs
    try:
        data = await _post(http, url + "/tokenize", body)
        tokens = data.get("tokens")
    except NoTokenize:
        chat = {**body, "max_tokens": 1, "temperature": 0.0, "return_prompt_token_ids": True}
        data = await _post(http, url + "/v1/chat/completions", chat)
        tokens = ((data.get("choices") or [{}])[0] or {}).get("prompt_token_ids")
        if tokens is None:
            raise ServerError(f"{url} has no /tokenize and its /v1/chat/completions ignores return_prompt_token_ids: "
                              "probe-kv needs SGLang 0.5.13 or newer (0.5.17 tested).") from None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        raise ProbeRequestError(f"{url}/tokenize returned no token list: {str(data)[:200]}")
    return tokens


def echoes(sent: list[int], reported: list[int]) -> bool:
    """The ids SGLang reports with input logprobs are the ids sent, except that SGLang 0.5.17 reports
    ids >= vocab_size - 1 as 0 (managers/scheduler_components/logprob_result_processor.py clips
    padded image hashes that way), which a small test vocabulary hits on every prompt."""
    return len(sent) == len(reported) and all(r == s or r == 0 for s, r in zip(sent, reported, strict=True))


def _generate_body(ids: list[int], max_new_tokens: int, top_k: int, start: int) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
            "return_logprob": True, "top_logprobs_num": top_k, "logprob_start_len": start}


def parse_positions(entries: Any, tops: Any, where: str) -> list[Position]:
    """[logprob, id, text] entries + per-position top lists → Positions (None logprobs are an error)."""
    if not isinstance(entries, list) or not isinstance(tops, list) or len(entries) != len(tops):
        raise ProbeRequestError(f"{where}: logprob lists missing or of different lengths "
                                "(does this server support return_logprob with top_logprobs_num?)")
    out = []
    for e, top in zip(entries, tops, strict=True):
        if not isinstance(e, list) or len(e) < 2 or e[0] is None or not isinstance(top, list):
            raise ProbeRequestError(f"{where}: unexpected logprob entry {str(e)[:80]} / {str(top)[:80]}")
        out.append(Position(int(e[1]), float(e[0]), tuple((float(t[0]), int(t[1])) for t in top)))
    return out


async def free_run(http: Http, url: str, ids: list[int], max_new_tokens: int, top_k: int) -> list[Position]:
    """Greedy decode from `ids`: the output tokens with their logprobs and top-k."""
    data = await _post(http, url + "/generate", _generate_body(ids, max_new_tokens, top_k, -1))
    meta = data.get("meta_info") or {}
    return parse_positions(meta.get("output_token_logprobs"), meta.get("output_top_logprobs"), f"{url}/generate output")


async def score(http: Http, url: str, prompt: list[int], reference: list[int], top_k: int,
                chunk: int) -> tuple[list[Position], int, int]:
    """Teacher-forced scoring of `reference` after `prompt`, `chunk` tokens per request (0: one
    request). Returns (positions, cached tokens reported, prefix tokens that could have been cached)."""
    # Why chunks: SGLang's prefill attention reads the tokens being extended in the model dtype and only the
    # cached prefix from the (fp8) KV pool; each chunk scored on the previous one's cached prefix reads the
    # rest from the pool, as decode does.
    step = chunk if chunk > 0 else max(1, len(reference))
    out: list[Position] = []
    cached = reusable = 0
    for a in range(0, len(reference), step):
        b = min(a + step, len(reference))
        start = len(prompt) + a - 1
        data = await _post(http, url + "/generate", _generate_body(prompt + reference[:b], 1, top_k, start))
        meta = data.get("meta_info") or {}
        entries, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
        if not isinstance(entries, list) or not isinstance(tops, list) or len(entries) != b - a + 1:
            got_n = len(entries) if isinstance(entries, list) else entries
            raise ProbeRequestError(f"{url}/generate: expected {b - a + 1} input logprobs from "
                                    f"logprob_start_len={start}, got {got_n!r}")
        # SGLang puts None at the first input position (logprob_result_processor.py): entry j >= 1 scores
        # reference token a + j - 1
        got = parse_positions(entries[1:], tops[1:], f"{url}/generate input")
        if not echoes(reference[a:b], [p.token for p in got]):
            raise ProbeRequestError(f"{url}/generate: input logprobs are not for the tokens sent")
        out.extend(replace(p, token=t) for p, t in zip(got, reference[a:b], strict=True))
        if a > 0:
            cached += min(int(meta.get("cached_tokens") or 0), start)  # the sim may match past the start
            reusable += start
    return out, cached, reusable
