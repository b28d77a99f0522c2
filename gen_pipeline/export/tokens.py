"""The `tokens` export: one row per assistant turn, `input_ids` + `loss_mask` (1 on exactly that turn's reasoning,
answer and end of turn, what SpecForge's ChatTemplate.end_of_turn_token and speculators' render boundary train),
from the server's token ids where the turn carries them, else rendered with the target's chat template (render.py).

Server ids: an assistant message carries both or neither of "prompt_token_ids" (the prompt as the server tokenized
it) and "token_ids" (reasoning, think markers, answer, and the matched stop token when finish_reason is "stop");
the row is the two end to end, masked 0…0 1…1. Where SGLang 0.5.17 returns them (sglang/srt/):
- /v1/chat/completions `return_token_ids: true` (entrypoints/openai/protocol.py:779; `return_prompt_token_ids`
  :778) → choices[i].prompt_token_ids and .token_ids (protocol.py:1097-1098; serving_chat.py:1016-1017,
  1819-1827); the reasoning parser splits only the decoded text (serving_chat.py:1779-1797).
- output_ids run through the stop token (managers/scheduler_components/output_streamer.py:399-401,
  schedule_batch.py:1463-1465); the detokenizer trims it from the text only (detokenizer_manager.py:176-205, 444).
- Streaming refuses both flags (serving_chat.py:914-924, HTTP 400); native /generate returns "output_ids"
  (tokenizer_manager.py:2327-2338, 2356-2360), "prompt_token_ids" when asked (io_struct.py:299,
  tokenizer_manager.py:2365)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from gen_pipeline.errors import ConfigError
from gen_pipeline.export.encode import ID_DTYPE, TextEncoder
from gen_pipeline.export.render import KWARGS_KEY, Renderer, recorded_kwargs

TOKEN_KEYS = ("prompt_token_ids", "token_ids")
# Rows hold their ids as numpy arrays (orjson writes them with OPT_SERIALIZE_NUMPY): 4 bytes a token
# instead of a Python int's ~36, so the 88K job's ~130M tokens fit in memory to be shuffled.
MASK_DTYPE = np.int8
BATCH_TURNS = 2048  # rendered turns rendered and tokenized at once
_Rendered = tuple[Renderer, list[dict[str, Any]], dict[str, Any], bool]  # (renderer, history, turn, cut)
_Pending = tuple[int, Renderer, list[dict[str, Any]], dict[str, Any], bool]  # the row's index, then _Rendered
CUT = ("length", "loop")  # a turn's finish_reason when the model did not end it (max_new_tokens, a loop kept cut)
SPOT_EVERY = 2048  # every so many rendered turns are also tokenized whole and compared


def has_server_ids(message: dict[str, Any]) -> bool:
    return all(isinstance(message.get(k), list | np.ndarray) for k in TOKEN_KEYS)


def compact_ids(sample: dict[str, Any]) -> None:
    """The sample's per-turn server token ids as int32 arrays, in place (see ID_DTYPE)."""
    for m in sample.get("conversations") or []:
        if isinstance(m, dict) and has_server_ids(m):
            for k in TOKEN_KEYS:
                m[k] = np.asarray(m[k], dtype=ID_DTYPE)


def _mask(n: int, first: int) -> np.ndarray[Any, Any]:
    """The loss mask of a row of `n` ids whose turn starts at `first`."""
    mask = np.zeros(n, dtype=MASK_DTYPE)
    mask[first:] = 1
    return mask


def strip_token_ids(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without the per-turn token ids (for the conversation formats)."""
    if not any(k in m for m in conversations for k in TOKEN_KEYS):
        return conversations
    return [{k: v for k, v in m.items() if k not in TOKEN_KEYS} for m in conversations]


SENT_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id")


def sent_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as the server got it in the request (chat.py sends role, content, reasoning_content, and on
    tool-use samples an assistant's tool_calls and a tool result's tool_call_id)."""
    return {k: v for k, v in m.items() if k in SENT_KEYS and v is not None}


def row_tools(row: dict[str, Any]) -> str:
    """A sample's tools as JSON text (meta.tools, written by run/chat.py for tool-use samples), "" when none."""
    meta = row.get("meta")
    tools = meta.get("tools") if isinstance(meta, dict) else None
    return tools if isinstance(tools, str) else ""


def sample_tools(sample: dict[str, Any]) -> list[Any] | None:
    """A tool-use sample's tools (meta.tools, JSON text), rendered as its requests were: the chat template's
    `tools` (apply_chat_template(tools=...), as SGLang passes them); None when it has none."""
    text = row_tools(sample)
    if not text:
        return None
    try:
        tools = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ConfigError(f"sample {sample.get('id')}: meta.tools is not JSON text ({text[:60]!r}); the row "
                          "was not written by gen-pipeline or was edited. Fix or remove it.") from None
    return tools if isinstance(tools, list) and tools else None


NO_TOKENIZER = "pass --tokenizer PATH or --server NAME"


class TokenRowBuilder:
    """The rows of many samples, rendered turns in batches, equal id for id to `slow_turn_ids`'s: the first and every
    SPOT_EVERY-th is checked against it; a difference (never seen) makes every row the plain way (`mismatch`)."""

    def __init__(self, renderer: Renderer | None, *, why: str = NO_TOKENIZER):
        self.renderer = renderer
        self.why = why  # why there is no renderer (export/core.py _renderer)
        self.exact = False  # the plain way: apply_chat_template in its batch form, the tokenizer on whole texts
        self.encoder: TextEncoder | None = None
        self.stats: Counter[str] = Counter()
        self.mismatch = ""  # the row whose spot check differed (then the builder went exact)

    def rows(self, samples: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        samples = samples if isinstance(samples, list) else list(samples)
        collecting = gc.isenabled()
        gc.disable()  # millions of short-lived lists of chunks and no cycles: the collector found nothing
        try:          # to free and cost time (docs/measurements.md, "export")
            return self._rows(samples)
        except _SpotMismatch as e:  # never seen: then every row the plain way
            self.stats["spot_mismatches"] += 1
            self.mismatch, self.exact = str(e), True
            return self._rows(samples)
        finally:
            if collecting:
                gc.enable()

    def notes(self) -> list[str]:
        """What the export says about how the rendered rows were made, when not the fast way."""
        out = []
        if self.mismatch:
            out.append(f"tokens: row {self.mismatch} differed from the plain path (the template and the tokenizer "
                       "on each turn alone), so every row was made the plain way; please report it")
        elif self.encoder is not None and not self.encoder.chunked:
            out.append(f"tokens: each rendered turn was tokenized whole ({self.encoder.why_whole}): exact, slower")
        old, flag = self.stats["rendered_flag_kwargs"], self.renderer.kwargs if self.renderer is not None else {}
        flag_json = orjson.dumps(flag, option=orjson.OPT_SORT_KEYS).decode()
        if old and (flag or self.stats["rendered_own_kwargs"]):  # a store from before them, alone: as ever
            out.append(f"tokens: {old:,} rendered samples recorded no chat_template_kwargs (written before "
                       f"meta.{KWARGS_KEY}): rendered with --template-kwargs {flag_json}")
        elif flag and self.stats["rendered_own_kwargs"]:
            out.append(f"tokens: --template-kwargs {flag_json} was not used: every rendered sample recorded the "
                       f"chat_template_kwargs its requests sent (meta.{KWARGS_KEY}) and is rendered with them")
        return out

    def _rows(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pending: list[_Pending] = []
        for sample in samples:
            for row, turn in self._sample_rows(sample):
                if turn is not None:
                    pending.append((len(out), *turn))
                out.append(row)
            if len(pending) >= BATCH_TURNS:  # at a sample's end: its turns share one batch
                self._tokenize(out, pending)
                pending = []
        if pending:
            self._tokenize(out, pending)
        return out

    def _sample_rows(self, sample: dict[str, Any]) -> Iterable[tuple[dict[str, Any], _Rendered | None]]:
        history: list[dict[str, Any]] = []
        k = 0
        recorded = recorded_kwargs(sample)
        renderer = self.renderer.for_kwargs(recorded) if self.renderer is not None else None
        tools = sample_tools(sample)
        if renderer is not None and tools is not None:  # rendered with its tools, as SGLang rendered its requests
            renderer = renderer.for_kwargs({**renderer.kwargs, "tools": tools})
        cut = cut_turns(sample)
        counted = False
        for m in sample["conversations"]:
            if m.get("role") != "assistant":
                history.append(sent_message(m))
                continue
            row: dict[str, Any] = {"id": f"{sample['id']}#turn{k}", "source_id": sample["id"], "turn_index": k,
                                   "dataset": sample.get("dataset"), "meta": sample.get("meta")}
            turn = sent_message(m)
            if has_server_ids(m):
                p = np.asarray(m["prompt_token_ids"], dtype=ID_DTYPE)
                ids = np.concatenate([p, np.asarray(m["token_ids"], dtype=ID_DTYPE)])
                row.update(input_ids=ids, loss_mask=_mask(len(ids), len(p)), ids_from="server")
                yield row, None
            elif renderer is None:
                raise ConfigError(f"sample {sample['id']} has no server token ids (prompt_token_ids / token_ids on "
                                  "its assistant turns), so the tokens format renders it with the target's chat "
                                  f"template: {self.why.rstrip('.')}.")
            else:
                row["ids_from"] = "template"
                if not counted:
                    self.stats["rendered_own_kwargs" if recorded is not None else "rendered_flag_kwargs"] += 1
                    counted = True
                yield row, (renderer, list(history), turn, k in cut)
            history.append(turn)
            k += 1

    def _tokenize(self, out: list[dict[str, Any]], batch: list[_Pending]) -> None:
        """One batch of rendered turns: each row's ids are a view of the batch's ids (prompt, then output).
        Each renderer (one per distinct chat_template_kwargs) renders its own turns."""
        assert self.renderer is not None
        if self.encoder is None:
            self.encoder = TextEncoder(self.renderer.tokenizer)
        if self.exact:  # apply_chat_template in its batch form, and whole texts
            self.encoder.whole("asked to be exact")
        texts: list[tuple[str, str]] = [("", "")] * len(batch)
        groups: dict[int, list[int]] = {}
        for j, (_, renderer, *_rest) in enumerate(batch):
            groups.setdefault(id(renderer), []).append(j)
        for js in groups.values():
            renderer = batch[js[0]][1]
            made = renderer.turn_texts([(batch[j][2], batch[j][3]) for j in js], direct=not self.exact)
            for j, (prompt, output) in zip(js, made, strict=True):
                texts[j] = (prompt, renderer.cut_end(output, batch[j][3]) if batch[j][4] else output)
        ids, starts = self.encoder.encode([x for pair in texts for x in pair])
        for j, (i, renderer, history, turn, cut) in enumerate(batch):
            begin, middle, end = (int(x) for x in starts[2 * j:2 * j + 3])
            row = out[i]
            row["input_ids"], row["loss_mask"] = ids[begin:end], _mask(end - begin, middle - begin)
            if not self.exact and self.stats["turns_rendered"] % SPOT_EVERY == 0:
                self._spot_check(row, renderer, history, turn, cut)
            self.stats["turns_rendered"] += 1

    def _spot_check(self, row: dict[str, Any], renderer: Renderer, history: list[dict[str, Any]],
                    turn: dict[str, Any], cut: bool) -> None:
        self.stats["spot_checks"] += 1
        ids, mask = slow_turn_ids(renderer, history, turn, cut=cut)
        if row["input_ids"].tolist() != ids or row["loss_mask"].tolist() != mask:
            raise _SpotMismatch(f"{row['id']}")


class _SpotMismatch(Exception):
    pass


def cut_turns(sample: dict[str, Any]) -> set[int]:
    """The assistant turns (by index) the model did not end: meta.per_turn's finish_reason, else (rows
    without it) the last turn when the sample's finish_reason says one was cut (a cut ends the sample)."""
    meta = sample.get("meta")
    if not isinstance(meta, dict):
        return set()
    per_turn = meta.get("per_turn")
    if isinstance(per_turn, list) and per_turn:
        return {k for k, t in enumerate(per_turn) if isinstance(t, dict) and t.get("finish_reason") in CUT}
    if meta.get("finish_reason") in CUT:
        return {sum(1 for m in sample["conversations"] if m.get("role") == "assistant") - 1}
    return set()


def slow_turn_ids(renderer: Renderer, history: list[dict[str, Any]],
                  turn: dict[str, Any], *, cut: bool = False) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one rendered turn the plain way: the template on this turn alone, the tokenizer
    on its prompt and its output; a `cut` turn (the model did not end it) without the end of turn."""
    prompt, output = renderer.turn_text(history, turn)
    output = renderer.cut_end(output, turn) if cut else output
    p, o = renderer.encode(prompt), renderer.encode(output)
    return p + o, [0] * len(p) + [1] * len(o)


SPECFORGE_MAX_LENGTH = 2048  # SpecForge 0.2.0's data.max_length default (specforge/config/schema.py)


def length_fit(rows: Iterable[dict[str, Any]], max_length: int) -> tuple[bool, str]:
    """(all kept, the line saying so): what SpecForge's data.prompts_path loader keeps of these rows at data.max_length:
    each row cut to it, one with no trained token left dropped (specforge/data/prompt_builder.py:243-246)."""
    masks = [np.asarray(r["loss_mask"]) for r in rows]
    n, trained = len(masks), sum(int(m.sum()) for m in masks)
    cut = [int(m[:max_length].sum()) for m in masks]
    kept, trained_kept = sum(c >= 1 for c in cut), sum(cut)
    share = f"{100 * trained_kept / trained:.1f}%" if trained else "-"
    line = (f"SpecForge data.max_length {max_length:,}: {kept:,} of {n:,} rows kept, {trained_kept:,} of "
            f"{trained:,} trained tokens ({share})")
    if kept == n and trained_kept == trained:
        return True, line
    return False, (line + "; rows are cut at max_length and those left with no trained token are dropped: raise "
            "data.max_length to the longest row (see --max-length N) or leave the long rows out")
