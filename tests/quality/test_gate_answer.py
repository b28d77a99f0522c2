"""What the gate makes of one attempt (run/answer.py, run/wire.py: SGLang 0.5.17's stream chunks, `judge`, a loop
at the cap) and its counts over rows and failures (quality/accounting.py) in status and the report page."""

from __future__ import annotations

import html

import httpx
import orjson
import pytest

from gen_pipeline.config.dataset import GenerationConfig, SamplingConfig
from gen_pipeline.errors import RequestError
from gen_pipeline.quality import LoopReason, RepetitionDetector, tail_loop
from gen_pipeline.quality.accounting import add_failure, add_meta, format_gate, merged
from gen_pipeline.records import Prompt, Sample
from gen_pipeline.reports.page import render_html
from gen_pipeline.reports.status import DatasetStatus, StatusReport, format_status
from gen_pipeline.run.answer import TurnStats, cut_at_loop, detect_loop, judge
from gen_pipeline.run.chat import ChatClient, ClientSettings
from gen_pipeline.run.wire import Retryable, TurnResult, TurnStream, parse_response

from mock_http import mock_http

KEEP = GenerationConfig(reasoning="keep")
DROP = GenerationConfig(reasoning="keep", truncated="drop")


def chunk(rid: str, *, reasoning: str | None = None, content: str | None = None, finish: str | None = None,
          tokens: int = 0) -> dict:
    delta = {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v is not None}
    return {"id": rid, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                        "finish_reason": finish}],
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}}


def turn(content: str, reasoning: str = "", finish: str = "stop", tokens: int = 20) -> TurnResult:
    return TurnResult(content, reasoning, finish, 9, tokens)


def test_a_stream_is_read_with_the_servers_counts_and_request_id() -> None:
    s = TurnStream(RepetitionDetector())
    chunks = [chunk("r1", content=""), chunk("r1", reasoning="Add 17 and 25.", tokens=4),
              chunk("r1", content="It is 42.", tokens=8), chunk("r1", finish="stop", tokens=8)]
    assert [s.feed(c) for c in chunks] == [None] * 4
    t = s.result()
    assert (t.reasoning, t.content, t.finish_reason, t.completion_tokens, t.reasoning_tokens, t.rid) == (
        "Add 17 and 25.", "It is 42.", "stop", 8, 4, "r1")


def test_a_loop_fires_on_the_stream_and_the_turn_is_cut_where_it_began() -> None:
    s = TurnStream(RepetitionDetector())
    s.feed(chunk("r2", content="Here is the plan. ", tokens=5))
    verdict, n = None, 5
    while verdict is None:
        n += 3
        verdict = s.feed(chunk("r2", content="the the the ", tokens=n))
        assert n < 600, "never fired"
    t = s.result(loop=verdict, aborted=True)  # no finish reason: the client closed the stream
    assert t.aborted and t.loop is verdict and t.completion_tokens == n and t.finish_reason == "length"
    kept = judge(cut_at_loop(t, verdict), KEEP)
    assert (kept.content, kept.finish_reason) == ("Here is the plan.", "loop")


def test_a_stream_that_stops_short_or_is_aborted_by_the_server_is_retried() -> None:
    s = TurnStream(None)
    s.feed(chunk("r3", content="partial", tokens=3))
    with pytest.raises(Retryable) as e:
        s.result()
    assert (e.value.reason, str(e.value)) == ("connection", "the stream ended before the answer did (3 tokens decoded)")
    s.feed(chunk("r3", finish="abort", tokens=3))
    with pytest.raises(Retryable) as e:
        s.result()
    assert e.value.reason == "aborted"


def test_an_error_chunk_is_final_for_a_4xx_and_retried_otherwise() -> None:
    with pytest.raises(RequestError) as e:
        TurnStream(None).feed({"object": "error", "message": "too long", "code": 400})
    assert (e.value.reason, e.value.retryable) == ("http_400", False)
    with pytest.raises(Retryable) as r:
        TurnStream(None).feed({"object": "error", "message": "busy", "code": 503})
    assert r.value.reason == "http_503"


@pytest.mark.parametrize(("content", "reasoning", "finish", "written"), [
    ("<think>plan</think>The answer.", "", "stop", ("plan", "The answer.", "think_marker")),
    ("The answer.</think>", "plan", "stop", ("plan", "The answer.", "think_marker")),
    ("Plain answer.", "plan", "stop", ("plan", "Plain answer.", "")),
])
def test_keep_repairs_and_flags_a_leak(content: str, reasoning: str, finish: str, written: tuple) -> None:
    t = judge(turn(content, reasoning, finish), KEEP)
    assert (t.reasoning, t.content, t.leak) == written


CUT = "the thinking was cut by max_new_tokens (20 tokens) before any answer"
FAIL_EMPTY = GenerationConfig(reasoning="keep", empty_turn="fail")


@pytest.mark.parametrize(("t", "cfg", "error", "retryable", "ends"), [
    (turn("<think>plan</think>The answer."), DROP, RequestError, ("leak", False), ""),  # drop fails a leak at once
    (turn("Okay, the user asks for a sum. Let me add", "", "length"), DROP, RequestError, ("truncated", False), ""),
    # a thinking cut before any answer, returned as content (a parser bug) or as reasoning: never written
    (turn("Okay, the user asks for a sum. Let me add", "", "length"), KEEP, RequestError, ("truncated", False), CUT),
    (turn("", "Let me add 17", "length"), KEEP, RequestError, ("truncated", False), CUT),
    # empty and marker-only answers follow empty_turn
    (turn("", "plan"), KEEP, Retryable, ("empty_turn", None), ""),
    (turn("<think></think>", "plan"), KEEP, Retryable, ("empty_turn", None), ""),
    (turn("", "plan"), FAIL_EMPTY, RequestError, ("empty_turn", False), ""),
    (turn("<think></think>", "plan"), FAIL_EMPTY, RequestError, ("empty_turn", False), ""),
])
def test_judge_fails_or_retries(t: TurnResult, cfg: GenerationConfig, error: type[Exception], retryable: tuple,
                                ends: str) -> None:
    with pytest.raises(error) as e:
        judge(t, cfg)
    assert (e.value.reason, getattr(e.value, "retryable", None)) == retryable
    assert str(e.value).endswith(ends)


def test_a_turns_accounting_has_the_same_keys_every_time() -> None:
    stats = TurnStats(attempts=3, loops=1, empty=1, tokens_not_decoded=7000, discarded_tokens=1200)
    meta = stats.meta(turn("ok", "plan", tokens=30))
    assert meta == {"finish_reason": "stop", "prompt_tokens": 9, "completion_tokens": 30, "reasoning_tokens": 0,
                    "attempts": 3, "loops": 1, "empty": 1, "leak": "", "tokens_not_decoded": 7000,
                    "discarded_tokens": 1200}
    assert stats.failure_extra() == {"loops": 1, "empty": 1, "tokens_not_decoded": 7000, "discarded_tokens": 1200}


# ---------------------------------------------------------------- a loop at the cap
NATURAL = ("The pool holds the prompt and the answer of every running request, so the server admits a new one "
           "only when the tokens it may still need fit beside those already there. ")
ANSWER = NATURAL * 2 + "The answer is the sum" + " of" * 162
BLOCK = " Check the value of the input and then go back to the first step of the list, as the manual says"


@pytest.mark.parametrize("text, period_words, start", [
    # too young for the streaming detector's window (test_a_streamed_turn_at_the_cap: it does not fire)
    (ANSWER, 1, ANSWER.index(" of" * 162) + 1),
    (NATURAL + BLOCK * 3, 22, len(NATURAL) + 1),  # 22 words: three copies are 66 >= tail_loop_words
    (NATURAL + BLOCK * 2, None, 0),  # fewer than min_copies
    (NATURAL + " of" * 63, None, 0),  # fewer than tail_loop_words words
])
def test_a_loop_at_the_cap_is_found_in_the_tail(text: str, period_words: int | None, start: int) -> None:
    v = tail_loop(text)
    expected = None if period_words is None else (LoopReason.PERIOD, period_words, start, len(text))
    assert (None if v is None else (v.reason, v.period_words, v.loop_start_char, v.at_char)) == expected


@pytest.mark.parametrize("finish, caught", [("length", True), ("stop", False)])
def test_a_streamed_turn_at_the_cap_is_judged_on_its_tail(finish: str, caught: bool) -> None:
    stream = TurnStream(RepetitionDetector())
    for word in ANSWER.split(" "):
        assert stream.feed(chunk("r", content=word + " ")) is None
    stream.feed(chunk("r", finish=finish, tokens=512))
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


# ---------------------------------------------------------------- the gate's counts
def per_turn(**kw: object) -> dict:
    return {"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 100, "reasoning_tokens": 40,
            "attempts": 1, "loops": 0, "empty": 0, "leak": "", "tokens_not_decoded": 0, "discarded_tokens": 0} | kw


def test_counts_over_rows_and_failures() -> None:
    counts: dict[str, int] = {}
    add_meta(counts, {"per_turn": [per_turn(), per_turn(attempts=3, loops=1, empty=1, tokens_not_decoded=7800,
                                                            discarded_tokens=500)]})
    add_meta(counts, {"per_turn": [per_turn(finish_reason="loop", loops=1, tokens_not_decoded=7900)]})
    add_meta(counts, {"per_turn": [per_turn(leak="think_marker")]})
    add_meta(counts, {"finish_reason": "stop"})  # a row written before the gate: nothing
    add_failure(counts, {"id": "x", "reason": "loop", "loops": 2, "tokens_not_decoded": 15000,
                         "discarded_tokens": 700})
    assert counts == {"turns": 4, "retried_turns": 1, "loops": 4, "loops_kept": 1, "empty": 1, "leaks": 1,
                      "tokens_not_decoded": 30700, "discarded_tokens": 1200}
    assert merged([counts, {"loops": 1}])["loops"] == 5
    assert format_gate(counts, 5400.0) == (
        "quality gate: 4 loops caught (1 kept cut), 1 empty answer retried, 1 leak flagged; 30,700 tokens not "
        "decoded (~1.50 GPU-h saved), 1,200 decoded and discarded")
    assert format_gate({"turns": 9}) == ""


def test_status_and_the_report_show_the_gate_with_the_estimate() -> None:
    d = DatasetStatus("B2", 100, done=100, completion_tokens=390_000, state="finished",
                      gate={"turns": 100, "loops": 2, "tokens_not_decoded": 15_000, "discarded_tokens": 10_000},
                      run_wall_s=800.0)
    # tokens not decoded × the runs' server-seconds per decoded token (written + discarded)
    assert d.server_s_saved == pytest.approx(15_000 * 800.0 / 400_000)
    assert d.to_dict()["server_s_saved"] == 30.0
    report = StatusReport([d], 100, 100, ["B2"])
    line = ("quality gate: 2 loops caught, 0 empty answers retried, 0 leaks flagged; 15,000 tokens not decoded "
            "(~30.0 server-s saved), 10,000 decoded and discarded")
    assert f"B2: {line}" in format_status(report).splitlines()
    page = render_html("B2", [], report, "no diagnosis")
    assert html.escape(f"B2: {line} (saved: an estimate, tokens not decoded up to max_new_tokens × the runs' wall "
                       "time × GPUs ÷ every token they decoded)") in page
