"""A loop that starts near max_new_tokens is too young for the streaming detector's window: at the cap the
turn's tail is checked once more (quality.tail_loop) before it is judged."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.quality import LoopReason, RepetitionDetector, tail_loop
from gen_pipeline.records import Prompt, Sample
from gen_pipeline.run.answer import detect_loop
from gen_pipeline.run.chat import ChatClient, ClientSettings
from gen_pipeline.run.wire import TurnStream, parse_response

from mock_http import mock_http

REPO = Path(__file__).resolve().parents[2]
NATURAL = ("The pool holds the prompt and the answer of every running request, so the server admits a new one "
           "only when the tokens it may still need fit beside those already there. ") * 1
ANSWER = NATURAL * 2 + "The answer is the sum" + " of" * 162


def test_a_loop_too_young_for_the_window_is_found_in_the_tail() -> None:
    detector = RepetitionDetector()
    assert detector.feed(ANSWER) is None and detector.finish() is None  # what the stream alone sees
    verdict = tail_loop(ANSWER)
    assert verdict is not None
    start = ANSWER.index(" of" * 162) + 1
    assert (verdict.reason, verdict.loop_start_char, verdict.at_char, verdict.period_words) == (
        LoopReason.PERIOD, start, len(ANSWER), 1)


@pytest.mark.parametrize("copies, found", [(2, False), (3, True)])
def test_a_block_repeated_at_the_end_needs_min_copies_and_tail_loop_words(copies: int, found: bool) -> None:
    block = " Check the value of the input and then go back to the first step of the list, as the manual says"
    words = len(re.findall(r"\w+|[^\w\s]", block))  # 22: three copies are 66 words
    text = NATURAL + block * copies
    verdict = tail_loop(text)
    assert (verdict is not None) == found
    if verdict is not None:
        assert (verdict.period_words, verdict.loop_start_char) == (words, len(NATURAL) + 1)
    assert tail_loop(NATURAL + " of" * 63) is None  # fewer than tail_loop_words words


@pytest.mark.parametrize("path", ["README.md", "gen_pipeline/quality/repetition.py", "gen_pipeline/run/chat.py"])
def test_natural_text_cut_anywhere_ends_in_no_loop(path: str) -> None:
    text = (REPO / path).read_text()
    for end in range(2_000, len(text), max(1, len(text) // 40)):
        assert tail_loop(text[:end]) is None, (path, end, text[end - 200:end])


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    chunk: dict = {"id": "r", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


@pytest.mark.parametrize("finish, caught", [("length", True), ("stop", False)])
def test_a_streamed_turn_at_the_cap_is_judged_on_its_tail(finish: str, caught: bool) -> None:
    stream = TurnStream(RepetitionDetector())
    for word in ANSWER.split(" "):
        assert stream.feed(_chunk({"content": word + " "})) is None
    stream.feed(_chunk(finish=finish, usage={"prompt_tokens": 9, "completion_tokens": 512}))
    turn = stream.result()
    assert (turn.loop is not None) == caught and turn.finish_reason == finish
    whole = parse_response({"choices": [{"message": {"content": ANSWER}, "finish_reason": finish}],
                            "usage": {"prompt_tokens": 9, "completion_tokens": 512}})
    assert (detect_loop(whole, RepetitionDetector()) is not None) == caught


async def test_the_client_retries_a_turn_that_loops_up_to_the_cap() -> None:
    seen: list[dict] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        looped = len(seen) == 1
        return httpx.Response(200, json={
            "id": "r", "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER if looped else
                                                            "Fine."}, "finish_reason": "length" if looped else "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 512 if looped else 2, "total_tokens": 0}})

    settings = ClientSettings(model="m", backend="sim", sampling=SamplingConfig(max_new_tokens=512),
                              generation=GenerationConfig(max_attempts=3, on_loop="retry"))
    async with mock_http(server) as http:
        sample = await ChatClient(http, ["http://s"], settings).regenerate(
            Prompt("T-1", ({"role": "user", "content": "q"},)), "T")
    assert isinstance(sample, Sample)
    assert len(seen) == 2 and "seed" in seen[1] and "seed" not in seen[0]
    turn = sample.meta["per_turn"][0]
    assert (sample.meta["finish_reason"], turn["loops"], turn["attempts"], sample.conversations[-1]["content"]) == (
        "stop", 1, 2, "Fine.")
