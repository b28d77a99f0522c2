"""Tool calls as SGLang 0.5.17 returns them (a request with `tools`, a server started with
--tool-call-parser; python/sglang/srt/entrypoints/openai/serving_chat.py). Pure: no I/O.

When the sim calls a tool (deterministic): the request carries `tools` with tool_choice other than
"none", the server has a --tool-call-parser, and the last message (a user turn or a tool result) asks
for calls with directives `[[call NAME {JSON arguments}]]` naming tools of the request (the bundled
tool-use dataset, datasets_cfg/data/tools.jsonl, writes them). Requests without tools, or without a
directive, are answered as before (text).

The answer: the model's text is the calls (`call_text`, Qwen2.5's <tool_call> form) then EOS, finish
"stop", which SGLang reports as finish_reason "tool_calls" with content "" and message.tool_calls
(whole), or streamed: per call a first delta.tool_calls piece [{"id", "index", "type": "function",
"function": {"name", "arguments": ""}}], then pieces with id and name null carrying the arguments as the
tokens arrive (_process_tool_call_stream; the rest at the end: _check_for_unstreamed_tool_args). Call ids:
kimi_k2's "functions.NAME:N" (N counts the calls in the request's history), else "call_" + 24 hex
(SGLang draws a uuid4; the sim derives it from the request id).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

DIRECTIVE = "[[call "


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text


def requested_calls(body: dict[str, Any], parser: str | None, rid: str) -> tuple[Call, ...]:
    """The calls this request's answer makes (none: an answer in text)."""
    tools, messages = body.get("tools"), body.get("messages") or []
    if not parser or not isinstance(tools, list) or not tools or body.get("tool_choice") == "none" or not messages:
        return ()
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") not in ("user", "tool"):
        return ()
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
    history = sum(len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict))
    calls: list[Call] = []
    for name, args in _directives(str(last.get("content") or "")):
        if name not in names:  # SGLang's detectors drop calls of tools the request does not list
            continue
        k = len(calls)
        cid = (f"functions.{name}:{history + k}" if parser == "kimi_k2"
               else "call_" + hashlib.blake2b(f"{rid}:{k}".encode(), digest_size=12).hexdigest())
        calls.append(Call(cid, name, json.dumps(args, ensure_ascii=False)))
    return tuple(calls)


def _directives(text: str) -> list[tuple[str, Any]]:
    out, at, decoder = [], 0, json.JSONDecoder()
    while (at := text.find(DIRECTIVE, at)) >= 0:
        start = at + len(DIRECTIVE)
        space = text.find(" ", start)
        if space < 0:
            break
        try:
            args, end = decoder.raw_decode(text, space + 1)
        except json.JSONDecodeError:
            at = start
            continue
        if isinstance(args, dict) and text.startswith("]]", end):
            out.append((text[start:space], args))
        at = end
    return out


def call_text(calls: tuple[Call, ...]) -> str:
    """What the model writes for its calls (Qwen2.5's form; the parser turns it into tool_calls)."""
    return "".join(f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>' for c in calls)


def message_calls(calls: tuple[Call, ...]) -> list[dict[str, Any]]:
    """message.tool_calls of a whole answer (protocol.py ToolCall)."""
    return [{"id": c.id, "index": k, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for k, c in enumerate(calls)]


def stream_pieces(calls: tuple[Call, ...], before: int, upto: int, total: int, named: set[int]) -> list[dict[str, Any]]:
    """delta.tool_calls pieces for output tokens (before, upto] of `total`: the arguments of all calls,
    laid end to end, are streamed in proportion to the tokens decoded; a call's first piece names it
    (`named`: the calls named so far, updated)."""
    size = sum(len(c.arguments) for c in calls)
    lo, hi = (size * before) // total, (size * upto) // total if upto < total else size
    out, start = [], 0
    for k, c in enumerate(calls):
        end = start + len(c.arguments)
        if k not in named and (k == 0 or start < hi or upto >= total):
            named.add(k)
            out.append({"id": c.id, "index": k, "type": "function", "function": {"name": c.name, "arguments": ""}})
        piece = c.arguments[max(lo, start) - start:max(0, min(hi, end) - start)]
        if piece:
            out.append({"id": None, "index": k, "type": "function", "function": {"name": None, "arguments": piece}})
        start = end
    return out
