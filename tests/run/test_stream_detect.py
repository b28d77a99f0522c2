"""The loop detector reads a stream every DETECT_EVERY_TOKENS tokens: the chunk-by-chunk verdict, at most
that many tokens later."""

from __future__ import annotations

import pytest

from gen_pipeline.quality import RepetitionDetector
from gen_pipeline.run.wire import DETECT_EVERY_TOKENS, TurnStream

INTRO = ("The pool holds the prompt and the answer of every running request, so the server admits a new one "
         "only when its tokens fit beside the others. ")
LOOP = "Then we add the two numbers and check the sum again. " * 40


def words(text: str) -> list[str]:
    """The text as one-token pieces (a word and the space before it)."""
    head, *rest = text.split(" ")
    return [head] + [" " + w for w in rest]


def chunk(content: str, tokens: int, finish: str | None = None) -> dict:
    return {"id": "r1", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}}


def first_verdict(pieces: list[str], per_chunk: int, detect_every: int) -> tuple[int, object]:
    """(completion tokens when the verdict came, the verdict) for the pieces streamed `per_chunk` a chunk."""
    stream = TurnStream(RepetitionDetector(), max_tokens=4096, detect_every=detect_every)
    for at in range(per_chunk, len(pieces) + per_chunk, per_chunk):
        verdict = stream.feed(chunk("".join(pieces[at - per_chunk:at]), min(at, len(pieces))))
        if verdict is not None:
            return stream.completion_tokens, verdict
    raise AssertionError("never fired")


@pytest.mark.parametrize("per_chunk", [1, 8])
def test_a_loop_is_caught_with_the_same_verdict_at_most_detect_every_tokens_later(per_chunk: int) -> None:
    pieces = words(INTRO + LOOP)
    at_once, verdict_at_once = first_verdict(pieces, per_chunk, detect_every=1)  # every chunk, as before
    later, verdict = first_verdict(pieces, per_chunk, detect_every=DETECT_EVERY_TOKENS)
    assert verdict == verdict_at_once
    assert at_once <= later < at_once + DETECT_EVERY_TOKENS + per_chunk
    assert DETECT_EVERY_TOKENS == 16


def test_the_deltas_not_read_yet_are_read_at_the_finish() -> None:
    pieces = words(INTRO + LOOP)
    at, _ = first_verdict(pieces, 1, detect_every=1)
    stream = TurnStream(RepetitionDetector(), max_tokens=4096, detect_every=10_000)  # never read mid-stream
    assert [stream.feed(chunk(p, i + 1)) for i, p in enumerate(pieces[:at])] == [None] * at
    verdict = stream.feed(chunk("", at, finish="length"))  # the finish: the detector reads what came
    assert verdict is not None and stream.detect_end() == verdict

