"""The loop detector, fed a turn's text as the stream delivers it (the rule: LoopThresholds). Pure; `feed` is
amortised O(len(delta)); words are cut from the text alone, so any split into deltas gives the same verdict."""

from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass

from gen_pipeline.quality.thresholds import DEFAULT_LOOP_THRESHOLDS, LoopThresholds

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"


def _word_re(t: LoopThresholds) -> re.Pattern[str]:
    # One CJK/kana/hangul character | letters and digits | a run of one symbol (underscore included).
    # Everything these leave out is whitespace.
    return re.compile(rf"[{_CJK}]|[^\W_{_CJK}]{{1,{t.max_word_chars}}}|([^\w\s]|_)\1{{0,{t.max_symbol_run_chars - 1}}}")


class LoopReason(enum.StrEnum):
    PERIOD = "period"  # repeats at a steady spacing cover period_share of the window
    LOW_DIVERSITY = "low_diversity"  # few distinct n-grams in the window
    WHITESPACE = "whitespace"  # a run of whitespace_run_chars blank characters


@dataclass(frozen=True)
class LoopVerdict:
    """The detector fired. Offsets count characters of the text fed so far (all deltas joined)."""

    reason: LoopReason
    at_char: int  # the end of the word (or whitespace character) that made it fire
    loop_start_char: int  # an estimate: where the first copy of the repeated text began
    period_words: int  # the spacing of the repeats when it fired, in words (0: whitespace)
    words: int  # words seen when it fired


class RepetitionDetector:
    """One per turn: `feed(delta)` each text delta in order; a non-None result means abort. After it fired,
    every call returns the same verdict without looking at the text."""

    def __init__(self, thresholds: LoopThresholds = DEFAULT_LOOP_THRESHOLDS) -> None:
        self.thresholds = t = thresholds
        self._re = _word_re(t)
        self._period_need = max(1, round(t.period_share * t.window_words))
        self._distinct_max = int(t.distinct_share * t.window_words)
        self.verdict: LoopVerdict | None = None
        self._pending = ""  # a word that reached the end of the last delta
        self.chars = 0  # characters fed (read-only, as `verdict`)
        self._ws_run = 0  # whitespace characters since the last word
        self._line_words = 0  # words since the last newline
        self._counted = False  # this line's list number was seen
        self._list_number = 0  # the last line's list number
        self._i = 0  # words seen
        self._gram: deque[str] = deque(maxlen=t.ngram_words)
        self._letter_at = 0  # word index of the latest word with a letter
        # the last ngram_words + 1 n-gram hashes: the first and the last make one 2 × ngram_words-gram
        self._hashes: deque[int] = deque(maxlen=t.ngram_words + 1)
        self._long_last: dict[int, int] = {}  # long n-gram hash -> word index of its latest occurrence
        self._new_at = 0  # word index of the latest long n-gram new within max_period_words
        self._verbatim_at = -t.window_words - 1  # word index where the latest verbatim copy ended
        self._verbatim_period = 0  # and its length in words
        # n-gram hash -> (word index of its latest occurrence, its distance to the one before, copies in a row)
        self._last: dict[int, tuple[int, int, int]] = {}
        self._prune_at = 2 * t.max_period_words
        self._window: deque[tuple[int, int, bool, bool]] = deque()  # (n-gram hash, repeat period, novel, numeric)
        self._hash_count: dict[int, int] = {}
        self._repeats = 0  # window words that are a repeat (see _word)
        self._novel = 0  # window words the turn had not used before
        self._numeric = 0  # window n-grams without a letter
        self._seen: set[str] = set()
        # start offsets of recent words, to place the loop's start
        self._starts: deque[int] = deque(maxlen=2 * t.max_period_words + t.window_words + t.ngram_words + 1)

    def feed(self, delta: str) -> LoopVerdict | None:
        """Take the next text delta; the verdict when the text is a loop, else None."""
        if self.verdict is not None or not delta:
            return self.verdict
        buf = self._pending + delta
        base = self.chars - len(self._pending)  # offset of buf[0] in the whole text
        self.chars += len(delta)
        pos, end = 0, len(buf)
        for m in self._re.finditer(buf):
            start, stop = m.span()
            if stop == end:  # the word may go on in the next delta
                self._pending = buf[start:]
                return self._gap(buf, pos, start, base)
            if (start > pos and self._gap(buf, pos, start, base)) or self._word(m.group(), base + start, base + stop):
                return self.verdict
            pos = stop
        self._pending = ""
        return self._gap(buf, pos, end, base)

    def finish(self) -> LoopVerdict | None:
        """The stream ended: count the held-back word too. The final verdict (None: no loop)."""
        if self.verdict is None and self._pending:
            word, self._pending = self._pending, ""
            self._word(word, self.chars - len(word), self.chars)
        return self.verdict

    def _gap(self, buf: str, start: int, stop: int, base: int) -> LoopVerdict | None:
        """Whitespace buf[start:stop]."""
        if stop <= start:
            return None
        if "\n" in buf[start:stop]:
            self._line_words, self._counted = 0, False
        need = self.thresholds.whitespace_run_chars
        if self._ws_run + stop - start >= need:
            at = base + start + (need - self._ws_run)
            self.verdict = LoopVerdict(LoopReason.WHITESPACE, at, at - need, 0, self._i)
        self._ws_run += stop - start
        return self.verdict

    def _word(self, word: str, start: int, stop: int) -> bool:
        t = self.thresholds
        self._ws_run = 0
        if self._line_words < t.line_number_words and not self._counted and word.isdecimal() and len(word) <= 4:
            # a number among a line's first words is "#" when it counts on (n + 1) from the last line that had one
            self._counted = True
            n, self._list_number = self._list_number, int(word)
            if self._list_number == n + 1:
                word = "#"
        self._line_words += 1
        self._i += 1
        self._starts.append(start)
        word = word.lower()
        # A word the turn has not used before means the text still brings something new: a list of
        # names, a licence with another holder, a table of measurements.
        novel = word not in self._seen
        self._seen.add(word)
        gram = self._gram
        gram.append(word)
        if word.isalnum() and not word.isdecimal():
            self._letter_at = self._i
        if len(gram) < t.ngram_words:
            return False
        h, i = hash(tuple(gram)), self._i
        prev, prev_dist, prev_run = self._last.get(h, (0, 0, 0))
        dist = i - prev if prev and i - prev <= t.max_period_words else 0
        # run: how many copies in a row this n-gram has had at a steady spacing (the first repeat
        # makes 2; a loop's copies may differ by a word or two, so "steady" has a slack)
        steady = dist and prev_dist and abs(dist - prev_dist) <= min(
            t.period_slack_max_words, max(t.period_slack_words, dist * t.period_slack_share))
        run = prev_run + 1 if steady else (2 if dist else 1)
        self._last[h] = (i, dist, run)
        period = dist if run >= (t.min_copies if dist <= t.long_period_words else t.min_copies_long) else 0
        self._note_copy(h, i, dist)
        self._slide(h, period, novel, i - self._letter_at >= t.ngram_words)
        if i >= self._prune_at:
            self._prune(i)
        if self._novel > t.max_novel_words:
            return False
        # PERIOD needs a verbatim copy of about `period` words ended within the window (of that period: rows that
        # differ in one value repeat each row's n-grams; a block of such rows quoted twice is a copy of the block)
        vp = self._verbatim_period
        if (period and self._repeats >= self._period_need and i - self._verbatim_at <= t.window_words
                and max(vp, period) < 2 * min(vp, period)):
            self._fire(LoopReason.PERIOD, stop)
        elif (len(self._window) == t.window_words and len(self._hash_count) <= self._distinct_max
              and self._numeric <= t.low_diversity_numeric_share * t.window_words):
            self._fire(LoopReason.LOW_DIVERSITY, stop)
        return self.verdict is not None

    def _note_copy(self, h: int, i: int, dist: int) -> None:
        """Whether the last `dist` words are a verbatim copy: none of their 2 × ngram_words-grams is new within
        max_period_words (rows that differ in one value bring a new long n-gram each; a loop's copy none)."""
        hashes = self._hashes
        hashes.append(h)
        if len(hashes) <= self.thresholds.ngram_words:
            return
        long_h = hash((hashes[0], h))
        prev = self._long_last.get(long_h, 0)
        self._long_last[long_h] = i
        if not prev or i - prev > self.thresholds.max_period_words:
            self._new_at = i
        elif dist and i - self._new_at >= dist:
            self._verbatim_at, self._verbatim_period = i, dist

    def _slide(self, h: int, period: int, novel: bool, numeric: bool) -> None:
        """Add the word's n-gram to the window and drop the oldest past window_words."""
        window = self._window
        window.append((h, period, novel, numeric))
        hc = self._hash_count
        hc[h] = hc.get(h, 0) + 1
        self._repeats += period > 0
        self._novel += novel
        self._numeric += numeric
        if len(window) > self.thresholds.window_words:
            old_h, old_period, old_novel, old_numeric = window.popleft()
            hc[old_h] -= 1
            if not hc[old_h]:
                del hc[old_h]
            self._repeats -= old_period > 0
            self._novel -= old_novel
            self._numeric -= old_numeric

    def _prune(self, i: int) -> None:
        """Forget n-grams last seen more than max_period_words ago (amortised O(1) per word)."""
        horizon = i - self.thresholds.max_period_words
        self._last = {h: last for h, last in self._last.items() if last[0] >= horizon}
        self._long_last = {h: last for h, last in self._long_last.items() if last >= horizon}
        self._prune_at = i + self.thresholds.max_period_words

    def _fire(self, reason: LoopReason, stop: int) -> None:
        """The first repeat in the window is a third copy; the first copy began two of its
        periods (plus the n-gram's length) before it."""
        t, window = self.thresholds, self._window
        first = next((k for k, (_, p, _, _) in enumerate(window) if p), 0)
        period = window[first][1] or 1
        word_index = self._i - len(window) + first  # 0-based index of that n-gram's last word
        start_index = max(0, word_index - 2 * period - (t.ngram_words - 1))
        oldest = self._i - len(self._starts)  # 0-based index of self._starts[0]
        start_char = self._starts[max(0, start_index - oldest)]
        self.verdict = LoopVerdict(reason, stop, start_char, window[-1][1] or period, self._i)


def tail_loop(text: str, thresholds: LoopThresholds = DEFAULT_LOOP_THRESHOLDS) -> LoopVerdict | None:
    """The loop a turn cut at max_new_tokens ends in, if any (LoopThresholds: tail_loop_words, min_copies):
    its last words are verbatim copies of one block of p words, case aside. Catches a loop younger than the
    streaming detector's window; offsets count characters of `text`; O(words) for a text without one."""
    t = thresholds
    spans = [(m.start(), m.end()) for m in _word_re(t).finditer(text)]
    words = [text[a:b].lower() for a, b in spans]
    n = len(words)
    for p in range(1, min(t.max_period_words, n // t.min_copies) + 1):
        i = n - 1
        while i >= p and words[i] == words[i - p]:
            i -= 1
        span = n - 1 - i + p  # words of the periodic tail: the first copy, then the repeats
        if span >= t.tail_loop_words and span >= p * (t.min_copies if p <= t.long_period_words else t.min_copies_long):
            return LoopVerdict(LoopReason.PERIOD, spans[-1][1], spans[n - span][0], p, n)
    return None
