"""The quality gate's pure checks (gen_pipeline/quality): the loop detectors (loops caught near their start, natural
text left alone, the same verdict in any chunking) and the leak checks of a finished turn (one reason per case)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen_pipeline import quality as Q
from gen_pipeline.quality import LeakReason, LoopReason, LoopThresholds, LoopVerdict, RepetitionDetector

REPO = Path(__file__).resolve().parents[2]
PROSE = (
    "The scheduler admits a request when its prompt fits the pool and reserves room for part of its "
    "output; when the pool fills mid-decode it retracts the newest request, frees its memory and puts it "
    "back in the queue, where it will be prefilled again later. Clients that flood the server therefore see "
    "stalls of tens of seconds, while clients that send too little leave the cache idle. A controller that "
    "watches the load and the measured throughput can keep the pool full without storms of retractions. "
)
STEP = ("Wait, let me re-check. If x = 7, then 3x + 4 = 25, which matches the equation, so x = 7 works. "
        "The other root would make the denominator zero. So the answer is 7.\n\n")


def feed_all(text: str) -> LoopVerdict | None:
    det = RepetitionDetector()
    for i in range(0, len(text), 7):
        if (v := det.feed(text[i:i + 7])) is not None:
            return v
    return det.finish()


def counting(n: int, item: str, fmt: str = "{k}. {item}\n", start: int = 1) -> str:
    return "".join(fmt.format(k=k, item=item) for k in range(start, start + n))


def thinking_rounds(n: int, seed: int = 3) -> str:
    """A thinking loop whose rounds open with one of six sentences of 2-10 words, at random."""
    rng = random.Random(seed)
    openers = ("Wait, let me re-check.", "Hmm, let me verify this again.", "Actually, let me double-check.",
               "Let me re-check this step.", "Wait.", "But wait, let me make sure.")
    step = " If x = 7, then 3x + 4 = 25, which matches the equation, so x = 7 works. So the answer is 7.\n\n"
    return "".join(rng.choice(openers) + (" Yes." if rng.random() < 0.2 else "") + step for _ in range(n))


LOOPS = [  # (name, natural prefix, loop text, reason, most characters from the loop's start to the abort)
    ("the the the", PROSE, "The" + " the" * 2366, LoopReason.PERIOD, 1100),  # ~260 words
    ("paragraph verbatim", STEP, (PROSE.strip() + "\n\n") * 20, LoopReason.PERIOD, 3 * len(PROSE) + 900),
    ("counting list", PROSE, counting(300, "Check the input file for errors."), LoopReason.PERIOD, 1500),
    ("step list", PROSE, counting(300, "verify the bound again.", "- Step {k}: {item}\n"), LoopReason.PERIOD, 1500),
    ("thinking loop", PROSE, STEP * 40, LoopReason.PERIOD, 3 * len(STEP) + 1200),
    ("blank lines", PROSE, "\n" * 5000, LoopReason.WHITESPACE, 400),
    ("symbols", PROSE, "=" * 20000, LoopReason.PERIOD, 16 * 260),  # 16 "=" are one word (and one BPE token)
    ("no spaces", PROSE, "ha" * 10000, LoopReason.PERIOD, 8 * 260),
    ("CJK", "这是一个自然的开头。", "我们再检查一下这个步骤。" * 400, LoopReason.PERIOD, 12 * 60),
    # the list's first number does not count on from anything: it keeps its value, the rest are "#"
    ("counting from 17", PROSE, counting(300, "verify the bound again.", "- Step {k}: {item}\n", 17),
     LoopReason.PERIOD, 1500),
    ("a row of numbers", PROSE, "[0, 0, 1, 0, 2, 0, 3],\n" * 400, LoopReason.PERIOD, 500),
    ("code with a sub-period", PROSE, 60 * (
        "        self.linear_1 = nn.Linear(config.vision_config.hidden_size, config.text_config.hidden_size)\n"
        "        self.linear_2 = nn.Linear(config.text_config.hidden_size, config.text_config.hidden_size)\n"),
     LoopReason.PERIOD, 1100),
    # rounds of ~35 words opened by one of six sentences: the opener breaks the steady spacing of the n-grams
    # around it, so they are caught late (docs/measurements.md)
    ("thinking rounds, varied openers", PROSE, thinking_rounds(200), LoopReason.PERIOD, 5000),
]


@pytest.mark.parametrize(("name", "prefix", "loop", "reason", "max_chars"), LOOPS, ids=[x[0] for x in LOOPS])
def test_loops_are_caught_near_their_start(name: str, prefix: str, loop: str, reason: LoopReason,
                                           max_chars: int) -> None:
    v = feed_all(prefix + loop)
    assert v is not None, f"{name}: not caught"
    assert v.reason is reason
    assert len(prefix) < v.at_char <= len(prefix) + max_chars, (name, v, len(prefix))
    assert abs(v.loop_start_char - len(prefix)) <= 2 * len(loop) // 10 + 80  # the estimate lands near the start


@pytest.mark.parametrize("path", ["README.md", "gen_pipeline/controller/core.py", "gen_pipeline/store/dataset_store.py",
                                  "sglang_sim/engine.py", "gen_pipeline/quality/repetition.py",
                                  "gen_pipeline/run/chat.py"])
def test_natural_text_and_code_are_left_alone(path: str) -> None:
    text = (REPO / path).read_text()
    assert feed_all(text) is None
    for end in range(2_000, len(text), max(1, len(text) // 40)):  # cut anywhere (at max_new_tokens): no tail loop
        assert Q.tail_loop(text[:end]) is None, (path, end, text[end - 200:end])


_rng = random.Random(7)
_NAMES = ["ada", "babbage", "curie", "davinci", "search", "similarity", "code", "text"]
_OPS = ["lt", "le", "eq", "ne", "ge", "gt"]
NOT_LOOPS = [  # (name, text, also after PROSE): repetitive, not looping
    ("distinct numbered list", "".join(f"{k}. {w} is item number {k * 7} of the inventory.\n"
                                       for k, w in enumerate(PROSE.split()[:60], 1)), False),
    ("table of numbers", "| a | b | c |\n|---|---|---|\n" + "".join(f"| {k} | {k * k} | {k ** 3 % 97} |\n"
                                                                     for k in range(200)), False),
    ("one repeat is not a loop", PROSE * 2, False),
    # natural text the first detector fired on (docs/measurements.md "Loop detector")
    # pandas test_join: every line's first number was "#", so a column of numbers was "#," at period 2
    ("a column of numbers", "left = np.array(\n    [\n"
     + "".join(f"        {_rng.randint(0, 3)},\n" for _ in range(300)) + "    ]\n)\n", True),
    # bpe_openai compat: rows that differ in one name (made of words the text has used: not novel)
    ("rows that differ in one name", "MODELS = {\n" + "".join(
        f'    "{a}-{b}-001": _metadata("r50k_base", chunk_limit=2_048, special_tokens={{"<|endoftext|>": 50_256}}),\n'
        for a, b in itertools.permutations(_NAMES, 2)) + "}\n", True),
    # packaging/version.py: sibling methods that differ in the operator
    ("sibling methods", "class Version:\n    # " + " ".join(_OPS) + "\n" + "".join(
        f"    def __{op}__(self, other: Version) -> bool:\n        if not isinstance(other, Version):\n"
        "            return NotImplemented\n        if self._key is None:\n"
        "            self._key = _cmpkey(self._epoch, self._release, self._pre, self._post)\n"
        f"        return self._key.__{op}__(other._key)\n\n" for op in _OPS), True),
    # numpy test_arraypad: a row of numbers quoted a dozen times (few distinct n-grams, all numbers)
    ("a row of numbers quoted 13 times", "b = np.array(\n    ["
     + ",\n     ".join(["[5, 6, 6, 5, 4, 4, 5, 6, 6, 5, 4, 4, 5, 6, 6]"] * 13) + "]\n)\n", True),
]


@pytest.mark.parametrize(("name", "text", "prefixed"), NOT_LOOPS, ids=[x[0] for x in NOT_LOOPS])
def test_repetitive_but_not_looping(name: str, text: str, prefixed: bool) -> None:
    assert feed_all(text) is None
    assert not prefixed or feed_all(PROSE + text) is None


def test_a_long_block_quoted_three_times_is_a_loop_only_with_more_copies() -> None:
    """Three copies of a 90-word block: one copy more than natural text usually has, so it fires
    only once repeats cover period_share of the window."""
    assert feed_all(PROSE * 3) is None
    assert feed_all(PROSE * 6) is not None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_chunking_gives_the_same_verdict(data: st.DataObject) -> None:
    prefix = data.draw(st.sampled_from(["", PROSE, PROSE[:77], "数据" * 30]))
    loop = data.draw(st.sampled_from([
        "The" + " the" * 600, STEP * 12, counting(120, "Check the input."), "\n" * 600, "-=" * 2000,
        PROSE, "x" * 3000, "ab " * 40 + "end.",
    ]) | st.text(max_size=3000))
    text = prefix + loop
    whole = RepetitionDetector()
    expected = whole.feed(text) or whole.finish()
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=60))))
    det, got, before, after = RepetitionDetector(), None, 0, 0
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        before = det.chars
        if (got := det.feed(text[a:b])) is not None:
            after = det.chars
            break
    else:
        got, before, after = det.finish(), len(text), len(text)
    assert got == expected
    if got is not None:  # returned by the delta that completed the word that fired (+ the held-back word)
        assert before <= got.at_char <= after
        assert after - got.at_char <= max(b - a for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True))


def test_the_the_the_is_stopped_within_512_tokens_and_the_verdict_sticks() -> None:
    """The report of issue 22: "The the the …" 2,366 times; " the" is one token of any BPE tokenizer."""
    det = RepetitionDetector()
    v = det.feed("The" + " the" * 2366)
    assert v is not None and v.period_words == 1 and v.at_char // len(" the") <= 512
    assert det.feed("completely new text") is v and det.finish() is v and det.verdict is v


def test_memory_stays_bounded_on_a_long_natural_stream() -> None:
    det = RepetitionDetector()
    words = [f"w{k}x{k * 7919 % 104729}" for k in range(60_000)]  # never repeats
    for k in range(0, len(words), 50):
        assert det.feed(" ".join(words[k:k + 50]) + " ") is None
    t = det.thresholds
    assert len(det._last) <= 2 * t.max_period_words + 1
    assert len(det._long_last) <= 2 * t.max_period_words + 1
    assert len(det._window) == t.window_words


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ngram_words": 0}, "ngram_words >= 1, window_words >= 8 and max_period_words >= 1 are required"),
    ({"period_share": 1.5}, "period_share must be in (0, 1] and distinct_share in (0, 1)"),
    ({"whitespace_run_chars": 0}, "whitespace_run_chars, max_word_chars and max_symbol_run_chars must be >= 1"),
    ({"low_diversity_numeric_share": -0.1}, "low_diversity_numeric_share must be in [0, 1]"),
])
def test_thresholds_refuse_nonsense(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        LoopThresholds(**kwargs)
    assert str(e.value) == message


# -- leaks ---------------------------------------------------------------------------------------
LEAKS = [  # content, reasoning_content, finish_reason, reasoning expected, reason (None: a plain answer)
    ("The answer is 4.", "2 + 2 = 4.", "stop", True, None),
    ("The answer is 4.", None, "stop", False, None),
    ("The answer is 4.", None, "stop", True, None),  # thinking may be skipped on easy turns
    ("", None, "stop", False, LeakReason.EMPTY),
    ("  \n ", "", "stop", True, LeakReason.EMPTY),
    (None, "Let me think about the carry. 17 + 25 ...", "length", True, LeakReason.CUT_IN_REASONING),
    ("", "", "length", True, LeakReason.EMPTY),
    ("</think>", None, "stop", True, LeakReason.MARKER_ONLY),
    ("<think>\n\n</think>\n\n", None, "stop", False, LeakReason.MARKER_ONLY),
    ("◁think▷◁/think▷", None, "stop", True, LeakReason.MARKER_ONLY),
    ("<|channel|>analysis<|message|><|end|>", None, "stop", True, LeakReason.MARKER_ONLY),
    ("<think>2 + 2 = 4</think>The answer is 4.", None, "stop", False, LeakReason.THINK_MARKER),
    ("The answer is 4.◁/think▷", "x", "stop", True, LeakReason.THINK_MARKER),
    ("Okay, the user asks for the sum. Let me add 17 and 25: 7 + 5 = 12, carry", None, "length", True,
     LeakReason.REASONING_IN_CONTENT),
    ("A long answer cut by the cap", None, "length", False, None),  # no thinking asked: a plain truncation
    ("A long answer cut by the cap", "short thought", "length", True, None),
]


@pytest.mark.parametrize(("content", "reasoning", "finish", "expected_reasoning", "reason"), LEAKS)
def test_leak_checks(content: str | None, reasoning: str | None, finish: str, expected_reasoning: bool,
                     reason: LeakReason | None) -> None:
    finding = Q.check_turn(content, reasoning, finish, reasoning_expected=expected_reasoning)
    assert (finding.reason if finding else None) is reason


def test_leak_details_say_what_was_found() -> None:
    f = Q.check_turn("Sure.</think>The answer.", None, "stop", reasoning_expected=True)
    assert f is not None and f.detail == "content holds '</think>' at char 5 (1 markers)"
    f = Q.check_turn(None, "thinking " * 10, "length", reasoning_expected=True)
    assert f is not None and f.detail == "finish_reason length with 90 chars of reasoning and no content"


def test_every_marker_is_found_and_alone_is_marker_only() -> None:
    for marker in Q.THINK_MARKERS:
        assert Q.find_markers(f"a {marker} b") == [(2, marker)]
        assert Q.is_marker_only(f"\n{marker}\n")
    assert not Q.is_marker_only("plain text") and not Q.is_marker_only("") and not Q.is_marker_only("</think> hi")
