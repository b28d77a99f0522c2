"""A deterministic, download-free stand-in tokenizer and chat template for the simulator.

Ids are computed arithmetically (no vocabulary table), so the tokenizer is lossless:
`decode(encode(text)) == text`, hence `encode(decode(encode(text))) == encode(text)`.
Pieces are found left to right by `_PIECE_RE`: an optional single leading space plus a
body (1-5 lowercase letters, a capital + 0-4 lowercase, 1-3 digits, or any other single
non-space character), or one whitespace character. English runs ~1.3 tokens per word.

The chat template renders "<|role|>\\n" + content + "\\n" per message + "<|assistant|>\\n".
Every rendered message ends with "\\n", which is always a piece of its own, so the
rendering of a conversation prefix is a token prefix of the whole conversation (turn two
hits the radix cache with turn one's prompt + output).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_PIECE_RE = re.compile(r"( ?)([a-z]{1,5}|[A-Z][a-z]{0,4}|[0-9]{1,3}|[^\sa-zA-Z0-9])|(\s)")

_CHARS = 0x110000  # every Unicode code point has a single-char id
_LOWER_MAX, _TAIL_MAX, _DIGIT_MAX = 5, 4, 3
_TO_B26 = str.maketrans("abcdefghijklmnopqrstuvwxyz", "0123456789abcdefghijklmnop")


def _offsets(base: int, max_len: int, min_len: int) -> list[int]:
    """offsets[n] = number of strings shorter than n (lengths min_len..), over `base` letters."""
    out, total = [0] * (max_len + 2), 0
    for n in range(min_len, max_len + 1):
        out[n] = total
        total += base**n
    out[max_len + 1] = total
    return out


_LOWER_OFF = _offsets(26, _LOWER_MAX, 1)
_TAIL_OFF = _offsets(26, _TAIL_MAX, 0)
_DIGIT_OFF = _offsets(10, _DIGIT_MAX, 1)
_N_LOWER = _LOWER_OFF[_LOWER_MAX + 1]
_N_CAP = 26 * _TAIL_OFF[_TAIL_MAX + 1]
_N_DIGIT = _DIGIT_OFF[_DIGIT_MAX + 1]

# Id blocks, each doubled: [plain | space-prefixed].
_CHAR_BASE = 0
_LOWER_BASE = _CHAR_BASE + 2 * _CHARS
_CAP_BASE = _LOWER_BASE + 2 * _N_LOWER
_DIGIT_BASE = _CAP_BASE + 2 * _N_CAP
VOCAB_SIZE = _DIGIT_BASE + 2 * _N_DIGIT


def _letters(value: int, n: int) -> str:
    chars = []
    for _ in range(n):
        value, d = divmod(value, 26)
        chars.append(chr(97 + d))
    return "".join(reversed(chars))


def _run_length(offsets: list[int], index: int, lo: int) -> int:
    n = lo
    while offsets[n + 1] <= index:
        n += 1
    return n


def _body_id(body: str) -> int:
    """Id of one piece body, without the space flag (block base included)."""
    c = body[0]
    if "a" <= c <= "z":
        return _LOWER_BASE + _LOWER_OFF[len(body)] + int(body.translate(_TO_B26), 26)
    if "A" <= c <= "Z":
        tail = body[1:]
        tail_index = _TAIL_OFF[len(tail)] + (int(tail.translate(_TO_B26), 26) if tail else 0)
        return _CAP_BASE + (ord(c) - 65) * _TAIL_OFF[_TAIL_MAX + 1] + tail_index
    if "0" <= c <= "9":
        return _DIGIT_BASE + _DIGIT_OFF[len(body)] + int(body)
    return _CHAR_BASE + ord(c)


def _block_size(body_id: int) -> int:
    if body_id >= _DIGIT_BASE:
        return _N_DIGIT
    if body_id >= _CAP_BASE:
        return _N_CAP
    if body_id >= _LOWER_BASE:
        return _N_LOWER
    return _CHARS


def encode(text: str) -> list[int]:
    """Text -> token ids (lossless; see the module docstring)."""
    ids = []
    for m in _PIECE_RE.finditer(text):
        space, body, ws = m.groups()
        if ws is not None:
            ids.append(_CHAR_BASE + ord(ws))
            continue
        bid = _body_id(body)
        ids.append(bid + _block_size(bid) if space else bid)
    return ids


def _decode_one(tid: int) -> str:
    if not 0 <= tid < VOCAB_SIZE:
        raise ValueError(f"token id {tid} is outside the simulator's vocabulary (0..{VOCAB_SIZE - 1})")
    if tid >= _DIGIT_BASE:
        space, idx = divmod(tid - _DIGIT_BASE, _N_DIGIT)
        n = _run_length(_DIGIT_OFF, idx, 1)
        body = str(idx - _DIGIT_OFF[n]).zfill(n)
    elif tid >= _CAP_BASE:
        space, idx = divmod(tid - _CAP_BASE, _N_CAP)
        cap, tail_idx = divmod(idx, _TAIL_OFF[_TAIL_MAX + 1])
        n = _run_length(_TAIL_OFF, tail_idx, 0)
        body = chr(65 + cap) + _letters(tail_idx - _TAIL_OFF[n], n)
    elif tid >= _LOWER_BASE:
        space, idx = divmod(tid - _LOWER_BASE, _N_LOWER)
        n = _run_length(_LOWER_OFF, idx, 1)
        body = _letters(idx - _LOWER_OFF[n], n)
    else:
        space, cp = divmod(tid - _CHAR_BASE, _CHARS)
        body = chr(cp)
    return " " + body if space else body


def decode(ids: Iterable[int]) -> str:
    """Token ids -> text. Raises ValueError for an id outside the vocabulary."""
    return "".join(_decode_one(t) for t in ids)


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                tools: Any = None) -> str:
    """The sim's chat template (reasoning_content of earlier turns is dropped, as real templates do); a
    request's tools as a "<|tools|>" turn first, an assistant turn's tool calls after its content as the
    model wrote them (sglang_sim/tools.py call_text)."""
    from sglang_sim.tools import Call, call_text

    parts = [f"<|tools|>\n{json.dumps(tools, ensure_ascii=False)}\n"] if tools else []
    for m in messages:
        calls = tuple(Call(str(c.get("id") or ""), str((c.get("function") or {}).get("name") or ""),
                           _arguments((c.get("function") or {}).get("arguments")))
                      for c in m.get("tool_calls") or () if isinstance(c, dict))
        parts.append(f"<|{m['role']}|>\n{m.get('content') or ''}{call_text(calls)}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def _arguments(args: Any) -> str:
    """A call's arguments as the model wrote them (JSON text, as json.dumps writes it)."""
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), ensure_ascii=False)
        except ValueError:
            return args
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def _output_pool(size: int = 4096) -> tuple[list[int], list[str]]:
    """Space-prefixed pseudo-words (+ ',' and '.') that re-tokenize to themselves in any order."""
    rng = random.Random(20261129)
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    texts = [","] * 48 + ["."] * 80
    while len(texts) < size:
        syllables = rng.randint(1, 2)
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
        texts.append(" " + word[: rng.randint(2, _LOWER_MAX)])
    return [encode(t)[0] for t in texts], texts


_POOL_IDS, _POOL_TEXTS = _output_pool()
_FIRST_IDS = [encode(w)[0] for w in ("The", "This", "Here", "First", "Sure", "Yes", "Let", "We")]


def draw_output_ids(seed: int, n_tokens: int) -> list[int]:
    """`n_tokens` deterministic output ids for `seed`; `encode(decode(ids)) == ids` holds."""
    if n_tokens <= 0:
        return []
    rng = random.Random(seed)
    first = _FIRST_IDS[rng.randrange(len(_FIRST_IDS))]
    return [first, *rng.choices(_POOL_IDS, k=n_tokens - 1)]


_FAST_TEXT = dict(zip(_POOL_IDS, _POOL_TEXTS, strict=True)) | {i: _decode_one(i) for i in _FIRST_IDS}


# The stop token a turn that ends normally ends with (an EOS id of a Kimi-like model): SGLang 0.5.17 returns it
# in the output ids (output_ids_through_stop, gen_pipeline/export/tokens.py) and counts it in completion_tokens,
# and its detokenizer leaves it out of the text (skip_special_tokens).
STOP_TOKEN_ID = 163586


def decode_output(ids: Iterable[int]) -> str:
    """decode() with a fast path for ids from draw_output_ids (no arithmetic per token); the stop token
    decodes to nothing, as SGLang's detokenizer skips it."""
    fast = _FAST_TEXT
    return "".join(fast.get(t) or _decode_one(t) for t in ids if t != STOP_TOKEN_ID)
