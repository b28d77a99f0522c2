"""The quality gate's thresholds: one table, every unit in the name. Words (letters/digits, one CJK character,
a run of one punctuation character), not model tokens: one word ≈ one BPE token (docs/measurements.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoopThresholds:
    """When the repetition detector fires (docs/measurements.md, "loop detector": false positives, latency, CPU).
    An `ngram_words`-gram in its `min_copies`-th copy in a row at a steady spacing (<= `max_period_words`) is a
    repeat. Over the last `window_words` words it fires when repeats cover `period_share` and a verbatim copy
    of about their spacing ended there (rows that differ in one value each bring a new 2 × ngram_words-gram),
    or at most `distinct_share` × window_words distinct n-grams (at most `low_diversity_numeric_share` without
    a letter); either way with at most `max_novel_words` words new to the turn (a loop brings none); or at a
    whitespace run of `whitespace_run_chars`. A loop of period p fires about max(2p + period_share ×
    window_words, p + window_words) words after its first copy starts."""

    ngram_words: int = 12
    window_words: int = 256
    period_share: float = 0.65
    # spacing drift between copies that still counts as steady: max(words, share × spacing), capped; a
    # thinking loop's rounds open with sentences of 2-10 words (docs/measurements.md, "loop detector").
    period_slack_words: int = 2
    period_slack_share: float = 0.2
    period_slack_max_words: int = 10
    # One verbatim repeat, even two, is common in natural text; a loop goes on. Long blocks need one more.
    min_copies: int = 3
    long_period_words: int = 160
    min_copies_long: int = 4
    distinct_share: float = 0.15
    max_novel_words: int = 2
    max_period_words: int = 1024
    whitespace_run_chars: int = 400
    # A longer word is cut into pieces, so "aaaa…" or "hahaha…" without end still makes words, each
    # about as long as a few model tokens.
    max_word_chars: int = 8
    # "=====…" is one word per this many characters (a rule line is a few words, not 80).
    max_symbol_run_chars: int = 16
    # A line-leading number that counts on from the previous line's (n + 1) counts as "#": a numbered
    # list that keeps counting with the same item text is a loop; numbers inside a line keep their value.
    line_number_words: int = 3
    # LOW_DIVERSITY leaves alone a window of mostly letterless n-grams (test data repeats rows of
    # numbers); a loop of numbers still fires by its period.
    low_diversity_numeric_share: float = 0.5
    # At max_new_tokens a loop younger than a window has not fired yet: repetition.tail_loop checks the
    # text once more; it ends in a loop when its last tail_loop_words or more words are min_copies
    # (min_copies_long past long_period_words) verbatim copies of one block.
    tail_loop_words: int = 64

    def __post_init__(self) -> None:
        if self.ngram_words < 1 or self.window_words < 8 or self.max_period_words < 1:
            raise ValueError("ngram_words >= 1, window_words >= 8 and max_period_words >= 1 are required")
        if not (0.0 < self.period_share <= 1.0 and 0.0 < self.distinct_share < 1.0):
            raise ValueError("period_share must be in (0, 1] and distinct_share in (0, 1)")
        if self.whitespace_run_chars < 1 or self.max_word_chars < 1 or self.max_symbol_run_chars < 1:
            raise ValueError("whitespace_run_chars, max_word_chars and max_symbol_run_chars must be >= 1")
        if not 0.0 <= self.low_diversity_numeric_share <= 1.0:
            raise ValueError("low_diversity_numeric_share must be in [0, 1]")


DEFAULT_LOOP_THRESHOLDS = LoopThresholds()
