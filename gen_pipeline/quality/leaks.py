"""Answers that are not answers (leaked reasoning, think markers, empty or marker-only content) in one finished
turn. SGLang 0.5.17's `--reasoning-parser` puts the thinking in `reasoning_content`; a parser that misses the end
marker returns it all in `content`; a server without a parser leaves the markers in it."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# Think markers of the reasoning parsers in SGLang 0.5.17 (python/sglang/srt/parser/reasoning_parser.py):
# deepseek-r1 / qwen3 / kimi_k2 / glm45 / minimax / nemotron_3 <think>; kimi ◁think▷; minimax-m3
# <mm:think>; mistral [THINK]; gpt-oss's analysis channel; kimi_k3 <|open|>think; gemma4 <|channel>.
THINK_MARKERS: tuple[str, ...] = (
    "<think>", "</think>", "◁think▷", "◁/think▷", "<mm:think>", "</mm:think>", "[THINK]", "[/THINK]",
    "<|channel|>analysis", "<|open|>think", "<|close|>think", "<|channel>", "<channel|>",
)
_MARKER_RE = re.compile("|".join(re.escape(m) for m in THINK_MARKERS))
# What a marker-only answer may hold besides markers: whitespace and the bits of gpt-oss/kimi_k3
# framing the parser would have stripped.
_FRAMING_RE = re.compile(r"(?:<\|[a-z_]+\|>|[\s])*")


class LeakReason(enum.StrEnum):
    EMPTY = "empty"  # no content, and no reasoning cut by the length cap to explain it
    MARKER_ONLY = "marker_only"  # content is think markers (and whitespace) only
    THINK_MARKER = "think_marker"  # content holds an answer and think markers
    REASONING_IN_CONTENT = "reasoning_in_content"  # cut inside the thinking, the reasoning came back as content
    CUT_IN_REASONING = "cut_in_reasoning"  # cut by the length cap inside the thinking: reasoning, no answer


@dataclass(frozen=True)
class LeakFinding:
    reason: LeakReason
    detail: str  # one line for logs and `validate`, e.g. "content holds '</think>' at char 812"


def find_markers(text: str) -> list[tuple[int, str]]:
    """(char offset, marker) of every think marker in `text`, in order."""
    return [(m.start(), m.group()) for m in _MARKER_RE.finditer(text)]


def strip_markers(text: str) -> str:
    """`text` without its think markers."""
    return _MARKER_RE.sub("", text)


def is_marker_only(text: str) -> bool:
    """True when `text` has at least one think marker and nothing else but whitespace/framing."""
    stripped = _MARKER_RE.sub("", text)
    return stripped != text and _FRAMING_RE.fullmatch(stripped) is not None


def check_turn(content: str | None, reasoning: str | None, finish_reason: str | None, *,
               reasoning_expected: bool) -> LeakFinding | None:
    """The one finding (the most specific) for a finished assistant turn, or None when it is a plain answer.
    `reasoning_expected`: the request asked for separate reasoning, so a turn without it is suspect."""
    content, reasoning, cut = content or "", reasoning or "", finish_reason == "length"
    if not content.strip():
        if cut and reasoning.strip():
            return LeakFinding(LeakReason.CUT_IN_REASONING,
                               f"finish_reason length with {len(reasoning)} chars of reasoning and no content")
        return LeakFinding(LeakReason.EMPTY, f"content is empty (finish_reason {finish_reason})")
    if is_marker_only(content):
        return LeakFinding(LeakReason.MARKER_ONLY, f"content is only think markers: {content.strip()[:60]!r}")
    if markers := find_markers(content):
        at, marker = markers[0]
        return LeakFinding(LeakReason.THINK_MARKER, f"content holds {marker!r} at char {at} ({len(markers)} markers)")
    if cut and reasoning_expected and not reasoning.strip():
        return LeakFinding(LeakReason.REASONING_IN_CONTENT,
                           f"finish_reason length, no reasoning_content, {len(content)} chars of content: "
                           "the reasoning parser returned the cut thinking as the answer")
    return None
