"""Degenerate outputs on demand (faults loop_rate, leak_rate, marker_only_rate; sglang_sim/faults.py):
a turn that falls into a loop and runs to its max_tokens cap, reasoning that comes back in
`content`, an answer of think markers only. Pure: token ids of the simulator's tokenizer, seeded by
the request, so the same request degenerates the same way in every run (and a retry with another
`seed` sampling parameter draws anew).

Every id list here re-tokenizes to itself (encode(decode(ids)) == ids), as draw_output_ids does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sglang_sim.tokenizer import decode, draw_output_ids, encode

LOOP_KINDS = ("word", "paragraph", "counting_list", "thinking")
LEAK_KINDS = ("reasoning_in_content", "think_markers")
MARKER_ONLY_TEXTS = ("<think>\n\n</think>", "</think>", "◁think▷◁/think▷", "<think></think>\n\n")
_CONNECTIVES = (" Wait, let me re-check.", " Wait, let me re-check this.")
_WORD_LOOPS = (" the", " and", " is", " of")


@dataclass(frozen=True)
class LoopPlan:
    kind: str
    ids: list[int]  # the whole output: natural tokens, then the loop up to the cap
    loop_start: int  # index in ids of the loop's first copy


def _rng(seed: int, salt: str) -> random.Random:
    return random.Random(f"{seed}:{salt}")


def loop_output(seed: int, natural_tokens: int, max_new_tokens: int) -> LoopPlan:
    """A turn that would have been `natural_tokens` long loops from a seeded point inside it
    and runs to `max_new_tokens`."""
    rng = _rng(seed, "loop")
    kind = LOOP_KINDS[rng.randrange(len(LOOP_KINDS))]
    start = rng.randrange(max(1, int(0.8 * min(natural_tokens, max_new_tokens))))
    ids = draw_output_ids(seed, start)
    loop: list[int] = []
    need = max_new_tokens - start
    if kind == "word":
        unit = encode(_WORD_LOOPS[rng.randrange(len(_WORD_LOOPS))])
        loop = unit * need
    elif kind == "paragraph":
        unit = draw_output_ids(rng.getrandbits(64), rng.randint(30, 150))[1:] + encode(".\n\n")
        loop = unit * (need // len(unit) + 1)
    elif kind == "counting_list":
        item, k = draw_output_ids(rng.getrandbits(64), rng.randint(6, 20))[1:] + encode("."), rng.randint(1, 9)
        while len(loop) < need:
            loop += encode(f"\n{k}.") + item
            k += 1
    else:  # thinking: the same step re-derived, opened by one of a few connectives
        step = draw_output_ids(rng.getrandbits(64), rng.randint(20, 80))[1:] + encode(".\n\n")
        while len(loop) < need:
            loop += encode(_CONNECTIVES[rng.randrange(len(_CONNECTIVES))]) + step
    return LoopPlan(kind, (ids + loop)[:max_new_tokens], start)


def leak_kind(seed: int) -> str:
    rng = _rng(seed, "leak")
    return LEAK_KINDS[rng.randrange(len(LEAK_KINDS))]


def marker_only_ids(seed: int) -> list[int]:
    rng = _rng(seed, "marker")
    return encode(MARKER_ONLY_TEXTS[rng.randrange(len(MARKER_ONLY_TEXTS))])


def loop_text(plan: LoopPlan) -> str:
    """The loop part as text (for tests and logs)."""
    return decode(plan.ids[plan.loop_start:])
