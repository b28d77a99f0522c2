"""The quality gate's thresholds: one table, every unit in the name.

Units. The loop detector counts **words**: a run of letters/digits (at most `max_word_chars`),
one CJK/kana/hangul character, or a run of one repeated punctuation character (at most
`max_symbol_run_chars`); whitespace separates words and is not one. The client sees text
deltas, not model tokens, so the budget the issue sets in model tokens ("aborted within ~512
tokens of the loop's start") is met through this assumption, measured by `python -m bench loops`:
one word ≈ 1.1–1.3 model tokens on English prose and code (BPE tokenizers split long and rare
words), ≈ 1 on the repetitive text of a loop (" the", "\\n", "1." are one token each), and
1 model token ≈ 4 characters of English. Where the stream carries token counts
(SGLang's `stream_options.continuous_usage_stats`), the caller can convert exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoopThresholds:
    """When the repetition detector (gen_pipeline/quality/repetition.py) fires.

    It hashes every `ngram_words`-gram and, for each, notes the distance in words back to its
    previous occurrence (0 when it has none within `max_period_words`). Over the last
    `window_words` n-grams it fires when either
      - one distance (a period) covers at least `period_share` of the window: an exact loop of any
        period up to `max_period_words` (a paragraph repeated verbatim, "the the the");
      - the distinct n-grams are at most `distinct_share` of the window: a short loop whose
        copies vary a little (a thinking loop re-deriving the same step with other connectives);
    or when a run of whitespace reaches `whitespace_run_chars` (a model emitting blank lines).
    A loop of period p words fires about p + period_share × window_words words after it starts.
    """

    ngram_words: int = 8
    window_words: int = 256
    period_share: float = 0.6
    period_slack_words: int = 2
    period_slack_share: float = 0.125
    period_slack_max_words: int = 8
    min_copies: int = 3
    long_period_words: int = 1024
    min_copies_long: int = 4
    distinct_share: float = 0.15
    max_period_words: int = 1024
    whitespace_run_chars: int = 400
    # A word longer than this is cut into pieces, so "aaaa…" without end still makes words.
    max_word_chars: int = 32
    # "=====…" is one word per this many characters (a rule line is a few words, not 80).
    max_symbol_run_chars: int = 4
    # A number among the first words of a line counts as "#": a numbered list that keeps counting
    # with the same item text is a loop ("12. Check the input.", "Step 13: ..."), and so is a list
    # whose numbers are the only change, while numbers inside a line (tables, CSV) keep their value.
    line_number_words: int = 3

    def __post_init__(self) -> None:
        if self.ngram_words < 1 or self.window_words < 8 or self.max_period_words < 1:
            raise ValueError("ngram_words >= 1, window_words >= 8 and max_period_words >= 1 are required")
        if not (0.0 < self.period_share <= 1.0 and 0.0 < self.distinct_share < 1.0):
            raise ValueError("period_share must be in (0, 1] and distinct_share in (0, 1)")
        if self.whitespace_run_chars < 1 or self.max_word_chars < 1 or self.max_symbol_run_chars < 1:
            raise ValueError("whitespace_run_chars, max_word_chars and max_symbol_run_chars must be >= 1")


DEFAULT_LOOP_THRESHOLDS = LoopThresholds()
